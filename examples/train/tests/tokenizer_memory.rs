//! Tokenizing a text corpus with a Hugging Face `tokenizer.json` streams:
//! on a generated 50 MB corpus of 80-character lines (no blank line, so one
//! document) its peak memory stays within twice the GPT-2 path's, and both
//! give the ids the whole document gave when it was encoded in one call (the
//! CRC32 of the token file main 35dc28c wrote for this corpus). Each
//! tokenizer runs in a child process of this test, whose peak resident set
//! size the kernel reports when it is reaped.
//!
//! Run alone: `cargo test -p trainer --test tokenizer_memory`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use trainer::data::token_cache::tokenize;
use trainer::tokenizer::Tokenizer;

const NAME: &str = "tokenizing_with_a_tokenizer_json_streams";
const CORPUS_BYTES: usize = 50 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, tokenizer, corpus, cache] = &args[..] {
        if flag == "--child" {
            let tokenizer = Tokenizer::from_name(tokenizer).expect("a tokenizer");
            let tokens = tokenize(Path::new(corpus), &tokenizer, Path::new(cache))
                .expect("the corpus tokenizes");
            println!("{} {}", tokens.tokens.len(), tokens.crc32);
            return;
        }
    }
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return;
    }
    // A filter that does not select this test (`cargo test some_name`).
    if let Some(filter) = args.iter().find(|a| !a.starts_with('-')) {
        if !NAME.contains(filter.as_str()) {
            return;
        }
    }
    tokenizing_with_a_tokenizer_json_streams();
    println!("test {NAME} ... ok");
}

/// 80-character lines of words, numbers and punctuation, drawn from a
/// seeded generator.
fn corpus(bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "the",
        "river",
        "ran",
        "to",
        "sea",
        "and",
        "a",
        "small",
        "fox",
        "watched",
        "it,",
        "while",
        "Anna",
        "counted",
        "42",
        "boats.",
        "Then",
        "she",
        "said:",
        "\"look!\"",
        "over",
        "there",
        "1997",
        "(quietly)",
    ];
    let mut state = 0x5eed_u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut text = String::with_capacity(bytes + 100);
    let mut line = 0;
    while text.len() < bytes {
        let word = WORDS[next() % WORDS.len()];
        if line + word.len() + 1 > 80 {
            text.push('\n');
            line = 0;
        } else if line > 0 {
            text.push(' ');
            line += 1;
        }
        text.push_str(word);
        line += word.len();
    }
    text
}

/// Runs the tokenizer `name` over `corpus` in a child process; returns its
/// peak resident set size in bytes, the tokens it wrote with their CRC32,
/// and its seconds.
fn child(name: &str, corpus: &Path, cache: &Path) -> (u64, (usize, u32), f64) {
    let started = Instant::now();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--child", name])
        .arg(corpus)
        .arg(cache)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the test starts itself");
    let pid = child.id() as libc::pid_t;
    let output = child.wait_with_output_after(pid);
    let seconds = started.elapsed().as_secs_f64();
    let (status, rusage, stdout) = output;
    assert!(status == 0, "{name}: the child failed ({status})");
    let mut fields = stdout
        .split_whitespace()
        .map(|f| f.parse::<u64>().expect("a number"));
    let (count, crc) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
    let tokens = (count as usize, crc as u32);
    // ru_maxrss is in KiB on Linux.
    (rusage.ru_maxrss as u64 * 1024, tokens, seconds)
}

trait ReapWithUsage {
    /// Waits for the child with `wait4`, which reports its resource usage.
    fn wait_with_output_after(self, pid: libc::pid_t) -> (i32, libc::rusage, String);
}

impl ReapWithUsage for std::process::Child {
    fn wait_with_output_after(mut self, pid: libc::pid_t) -> (i32, libc::rusage, String) {
        let mut stdout = String::new();
        if let Some(mut out) = self.stdout.take() {
            std::io::Read::read_to_string(&mut out, &mut stdout).expect("child output");
        }
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value to be overwritten, and
        // `pid` is this process's own unreaped child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        assert_eq!(reaped, pid, "wait4 failed");
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        };
        // The child is reaped: std must not wait for it again.
        std::mem::forget(self);
        (code, usage, stdout)
    }
}

fn tokenizing_with_a_tokenizer_json_streams() {
    let dir = tempfile::tempdir().unwrap();
    let corpus_path = dir.path().join("corpus.txt");
    std::fs::write(&corpus_path, corpus(CORPUS_BYTES)).unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/tokenizer.json");
    let (gpt2_rss, gpt2_tokens, gpt2_s) = child("gpt2", &corpus_path, &dir.path().join("a"));
    let (hf_rss, hf_tokens, hf_s) = child(
        fixture.to_str().unwrap(),
        &corpus_path,
        &dir.path().join("b"),
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "50 MB corpus: GPT-2 {} tokens, {:.0} MiB peak, {gpt2_s:.1} s; \
         tokenizer.json {} tokens, {:.0} MiB peak, {hf_s:.1} s; memory ratio {:.2}",
        gpt2_tokens.0,
        mib(gpt2_rss),
        hf_tokens.0,
        mib(hf_rss),
        hf_rss as f64 / gpt2_rss as f64
    );
    // Token counts and CRC32s of the files main wrote (the whole document
    // encoded at once): bench/results/tokenize-memory.txt.
    assert_eq!(
        gpt2_tokens,
        (13_957_673, 1_719_906_326),
        "GPT-2 ids changed"
    );
    assert_eq!(
        hf_tokens,
        (35_081_266, 385_968_244),
        "tokenizer.json ids changed"
    );
    assert!(
        hf_rss <= 2 * gpt2_rss,
        "tokenizer.json peaked at {:.0} MiB, more than twice the GPT-2 path's {:.0} MiB",
        mib(hf_rss),
        mib(gpt2_rss)
    );
}
