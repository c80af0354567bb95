//! The markup every page of the eval shares: escaping, the style sheet,
//! the configs' colours.

/// Colors of the configs, in order (plots and table headers agree).
pub const CONFIG_COLORS: [(u8, u8, u8); 6] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (148, 103, 189),
    (214, 39, 40),
    (140, 86, 75),
];

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's style sheet (the simulation's report uses it too).
pub const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.hint { white-space: pre-wrap; max-width: 40em; font-size: 0.9em; }
.cat { font-size: 0.8em; padding: 1px 4px; border-radius: 3px; background: #eee; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; }
.meta { color: #666; }
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
    }
}
