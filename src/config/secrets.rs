//! Secrets taken out of text that is shown: the marker that stands for
//! one, and the secret parts of URLs (a user and password before the host,
//! the query), which the config (`[llm] base_url`), the SDK variables
//! (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`) and a proxy's URL may carry.

use std::borrow::Cow;

/// The text shown in place of a secret.
pub const REDACTED: &str = "<redacted>";

/// `url` with its user info (`user:password@`) and its query replaced by
/// [`REDACTED`]; unchanged when it has neither.
pub fn redact_url(url: &str) -> Cow<'_, str> {
    redact_urls(url)
}

/// `text` with the user info and the query of every URL in it (a
/// `scheme://` and what follows up to a space, a quote, an angle bracket
/// or a closing bracket) replaced by [`REDACTED`]; borrowed when nothing
/// was.
pub fn redact_urls(text: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + "://".len();
        let end = text[start..]
            .find(|c: char| c.is_whitespace() || "\"'`<>)]}".contains(c))
            .map_or(text.len(), |n| start + n);
        if let Some(clean) = redact_after_scheme(&text[start..end]) {
            out.push_str(&text[copied..start]);
            out.push_str(&clean);
            copied = end;
        }
        from = end.max(start);
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// What follows a URL's `://`, redacted, or `None` when nothing is secret.
fn redact_after_scheme(rest: &str) -> Option<String> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let user_info = rest[..authority_end].rfind('@');
    let query = rest[authority_end..].find('?').map(|q| authority_end + q);
    if user_info.is_none() && query.is_none() {
        return None;
    }
    let mut out = String::new();
    let host_start = match user_info {
        Some(at) => {
            out.push_str(REDACTED);
            at
        }
        None => 0,
    };
    match query {
        Some(q) => {
            out.push_str(&rest[host_start..=q]);
            out.push_str(REDACTED);
            if let Some(fragment) = rest[q..].find('#') {
                out.push_str(&rest[q + fragment..]);
            }
        }
        None => out.push_str(&rest[host_start..]),
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_loses_its_user_info_and_query() {
        let cases = [
            (
                "http://user:pass@127.0.0.1:8080/v1",
                "http://<redacted>@127.0.0.1:8080/v1",
            ),
            (
                "https://api.example.com/v1?key=s3cret&x=1",
                "https://api.example.com/v1?<redacted>",
            ),
            ("http://u@h/p?q=1#frag", "http://<redacted>@h/p?<redacted>#frag"),
            ("http://a:b@c@host?x", "http://<redacted>@host?<redacted>"),
            ("https://api.anthropic.com", "https://api.anthropic.com"),
            ("http://host/path/with@sign", "http://host/path/with@sign"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        assert!(matches!(
            redact_url("https://api.anthropic.com/v1"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn every_url_in_a_text_is_redacted() {
        let text = "error sending request for url (http://127.0.0.1:9/v1/messages?sig=S3CRET): \
                    proxy http://u:PASS@proxy:3128 refused; see \"https://x.io/a?token=T\"";
        assert_eq!(
            redact_urls(text),
            "error sending request for url (http://127.0.0.1:9/v1/messages?<redacted>): \
             proxy http://<redacted>@proxy:3128 refused; see \"https://x.io/a?<redacted>\""
        );
        assert!(matches!(redact_urls("no url :// here"), Cow::Borrowed(_)));
        assert_eq!(redact_urls("://a@b"), "://<redacted>@b");
    }
}
