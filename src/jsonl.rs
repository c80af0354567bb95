//! Line-oriented files (JSONL): the one loop every reader shares.

use std::io::BufRead;
use std::path::Path;

/// Calls `f(line_number, line)` (numbers from 1) for every non-blank line of
/// `path`, stopping at the first error. A failure to open or read the file
/// becomes an error through `io_error`.
pub fn for_each_line<E>(
    path: &Path,
    io_error: impl Fn(std::io::Error) -> E,
    mut f: impl FnMut(usize, &str) -> Result<(), E>,
) -> Result<(), E> {
    let file = std::fs::File::open(path).map_err(&io_error)?;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(&io_error)?;
        if !line.trim().is_empty() {
            f(i + 1, &line)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_blank_lines_and_numbers_from_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.jsonl");
        std::fs::write(&path, "a\n\n  \nb\n").unwrap();
        let mut seen = Vec::new();
        for_each_line(
            &path,
            |e| e.to_string(),
            |n, line| {
                seen.push((n, line.to_string()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, [(1, "a".to_string()), (4, "b".to_string())]);
        let missing = for_each_line(&dir.path().join("nope"), |e| e.kind(), |_, _| Ok(()));
        assert_eq!(missing, Err(std::io::ErrorKind::NotFound));
        let stopped = for_each_line(&path, |e| e.to_string(), |n, _| Err(format!("line {n}")));
        assert_eq!(stopped, Err("line 1".to_string()));
    }
}
