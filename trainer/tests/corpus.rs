//! Text corpora tokenized once into a memory-mapped token file in the cache,
//! and read back from it by later runs.

use std::path::Path;

use trainer::data::read_corpus;
use trainer::token_cache::{tokenize, CHUNK_BYTES};
use trainer::tokenizer::Tokenizer;

mod common;

fn ids(file: &trainer::token_cache::TokenFile) -> Vec<u32> {
    (0..file.len()).map(|i| file.get(i)).collect()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_corpus_is_tokenized_once_then_read_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (data, root) = (dir.path().join("data"), dir.path().join("cache"));
    std::fs::create_dir(&data).unwrap();
    write(&data.join("a.txt"), "first file\n\nwith two paragraphs");
    write(
        &data.join("b.jsonl"),
        "{\"text\": \"a record\"}\n{\"text\": \"another one\"}\n",
    );
    let byte = Tokenizer::from_name("byte").unwrap();
    let first = tokenize(&data, &byte, &root).unwrap();
    assert!(first.tokens_per_s.is_some(), "tokenized now");
    // Byte-level: exactly the documents joined by blank lines.
    let joined = read_corpus(&data).unwrap();
    assert_eq!(ids(&first.tokens), byte.encode(&joined));

    let again = tokenize(&data, &byte, &root).unwrap();
    assert!(again.tokens_per_s.is_none(), "read from the cache");
    assert_eq!(again.folder, first.folder);
    assert_eq!(
        (again.tokens.len(), again.crc32),
        (first.tokens.len(), first.crc32)
    );

    // Another tokenizer, or a changed file, is another cache entry.
    let gpt2 = Tokenizer::from_name("gpt2").unwrap();
    let other = tokenize(&data, &gpt2, &root).unwrap();
    assert_ne!(other.folder, first.folder);
    assert_eq!(
        ids(&other.tokens),
        gpt2.encode("first file\n\nwith two paragraphs")
            .into_iter()
            .chain(gpt2.encode("\n\n"))
            .chain(gpt2.encode("a record\n\nanother one"))
            .collect::<Vec<_>>()
    );
    // GPT-2's ids fit 16 bits: two bytes each on disk.
    let bin = std::fs::metadata(other.folder.join("tokens.bin"))
        .unwrap()
        .len();
    assert_eq!(bin as usize, 2 * other.tokens.len());
    write(&data.join("a.txt"), "first file, edited");
    let edited = tokenize(&data, &byte, &root).unwrap();
    assert!(edited.tokens_per_s.is_some());
    assert_ne!(edited.folder, first.folder);
}

/// A text file larger than a chunk is cut at blank lines and tokenized in
/// parallel; byte-level ids equal the whole text's.
#[test]
fn a_large_text_file_is_cut_at_blank_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.txt");
    let paragraph = "lorem ipsum dolor sit amet ".repeat(40);
    let text = vec![paragraph; 2 * CHUNK_BYTES / 1000 + 50].join("\n\n");
    assert!(text.len() > 2 * CHUNK_BYTES);
    write(&file, &text);
    let byte = Tokenizer::from_name("byte").unwrap();
    let tokenized = tokenize(&file, &byte, &dir.path().join("cache")).unwrap();
    assert_eq!(tokenized.tokens.len(), text.len());
    assert!(ids(&tokenized.tokens)
        .iter()
        .zip(text.bytes())
        .all(|(&a, b)| a == b as u32));
}

#[test]
fn bad_corpus_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let byte = Tokenizer::from_name("byte").unwrap();
    let root = dir.path().join("cache");
    let binary = dir.path().join("binary.txt");
    std::fs::write(&binary, [0x66, 0x6f, 0xff, 0xfe]).unwrap();
    let err = tokenize(&binary, &byte, &root).unwrap_err().to_string();
    assert!(
        err.contains("is not UTF-8 text (invalid byte at offset 2)"),
        "{err}"
    );
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let err = tokenize(&empty, &byte, &root).unwrap_err().to_string();
    assert!(err.contains("is empty"), "{err}");
    // Nothing half-written is left in the cache.
    let left: Vec<_> = std::fs::read_dir(&root)
        .map(|r| r.filter_map(|e| e.ok()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn train_tokenizes_into_the_cache_once_and_reports_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("corpus.txt");
    write(&data, &"a small corpus of words for training. ".repeat(50));
    let cache = dir.path().join("cache");
    let run = |extra: &[&str]| {
        let base = [
            &["--steps", "1"][..],
            &common::FAST,
            &["--data", data.to_str().unwrap()],
        ];
        let out = common::train(&base.concat(), extra);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with_cache = ["--data-cache", cache.to_str().unwrap()];
    let (ok, first) = run(&with_cache);
    assert!(
        ok && first.contains("tokenized at") && first.contains("tok/s"),
        "{first}"
    );
    let (ok, second) = run(&with_cache);
    assert!(ok && second.contains("read from"), "{second}");
    let (ok, err) = run(&[&with_cache[..], &["--data-format", "chat"]].concat());
    assert!(
        !ok && err.contains("--data-cache holds tokenized text corpora"),
        "{err}"
    );
}
