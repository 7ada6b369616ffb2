//! An error as the one line `train` prints: each cause said once, written to
//! stderr in one piece (several processes share it).

use std::io::Write;

/// `err` and its causes joined by `: `, leaving out a cause whose text the
/// line already holds (an error that names its source in its own message),
/// with line breaks turned into spaces.
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// Prints `error: <line>` to stderr with a single write, so that the lines
/// of processes sharing stderr never interleave.
pub fn print_error(prefix: &str, err: &anyhow::Error) {
    let text = format!("error: {prefix}{}\n", error_line(err));
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// An error about the file a flag names, said as `--flag `path` …` when the
/// message starts with the path (others name their subject themselves).
pub fn flagged<E: std::fmt::Display>(flag: &'static str) -> impl Fn(E) -> anyhow::Error {
    move |err| {
        let text = err.to_string();
        if text.starts_with('`') {
            anyhow::anyhow!("{flag} {text}")
        } else {
            anyhow::anyhow!(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("invalid engine config: {0}")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("fused mode cannot accumulate")]
    struct Inner;

    #[test]
    fn a_cause_the_message_already_holds_is_said_once() {
        let err = anyhow::Error::new(Outer(Inner)).context("step 3");
        assert_eq!(
            error_line(&err),
            "step 3: invalid engine config: fused mode cannot accumulate"
        );
        let err = anyhow::anyhow!("two\nlines").context("outer");
        assert_eq!(error_line(&err), "outer: two lines");
    }
}
