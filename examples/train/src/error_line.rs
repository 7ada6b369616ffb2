//! An error as the one line `train` prints: each cause said once, written to
//! stderr in one piece (several processes share it).

use std::error::Error;
use std::fmt::Display;
use std::io::Write;

/// `err` and its sources joined by `: `, leaving out a source whose text the
/// line already holds (an error that names its source in its own message),
/// with line breaks turned into spaces.
pub fn error_line(err: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(err);
    while let Some(err) = cause {
        let text = err.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = err.source();
    }
    line.replace('\n', " ")
}

/// Prints `error: <line>` to stderr with a single write, so that the lines
/// of processes sharing stderr never interleave.
pub fn print_error(prefix: &str, err: &(dyn Error + 'static)) {
    let text = format!("error: {prefix}{}\n", error_line(err));
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// An error about the file a flag names, said as `--flag `path` …` when its
/// message starts with the path (others name their subject themselves).
pub fn flagged(flag: &str, err: &dyn Display) -> String {
    let text = err.to_string();
    if text.starts_with('`') {
        format!("{flag} {text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("step 3")]
    struct Step(#[source] Outer);

    #[derive(Debug, thiserror::Error)]
    #[error("invalid engine config: {0}")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("fused mode cannot accumulate")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Wrapping(#[source] Lines);

    #[derive(Debug, thiserror::Error)]
    #[error("two\nlines")]
    struct Lines;

    #[test]
    fn a_cause_the_message_already_holds_is_said_once() {
        assert_eq!(
            error_line(&Step(Outer(Inner))),
            "step 3: invalid engine config: fused mode cannot accumulate"
        );
        assert_eq!(error_line(&Wrapping(Lines)), "outer: two lines");
    }

    #[test]
    fn a_path_first_message_is_said_after_its_flag() {
        #[derive(Debug, thiserror::Error)]
        #[error("`{0}` does not exist")]
        struct Missing(&'static str);
        assert_eq!(
            flagged("--data", &Missing("x.txt")),
            "--data `x.txt` does not exist"
        );
        assert_eq!(
            flagged("--data", &"seq_len must be at least 1"),
            "seq_len must be at least 1"
        );
    }
}
