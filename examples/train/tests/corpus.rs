//! Text corpora tokenized once into a memory-mapped token file in the cache,
//! and read back from it by later runs.

use std::path::Path;

use trainer::data::read_corpus;
use trainer::data::token_cache::{pieces, tokenize, CHUNK_BYTES, MAX_PIECE_BYTES, PIECE_BYTES};
use trainer::tokenizer::Tokenizer;

mod common;

fn ids(file: &trainer::data::token_cache::TokenFile) -> Vec<u32> {
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

/// Text of about `bytes`: words, numbers, punctuation, runs of spaces, tabs
/// and non-ASCII letters, on `line`-character lines (one line when 0).
fn varied_text(bytes: usize, line: usize) -> String {
    const WORDS: [&str; 16] = [
        "the",
        "river's",
        "ran",
        "42",
        "boats.",
        "Zürich",
        "東京",
        "  double",
        "\ttab",
        "(quietly)",
        "naïve",
        "said:",
        "\"look!\"",
        "1997,",
        "it'll",
        "—dash",
    ];
    let mut state = 7u64;
    let mut text = String::with_capacity(bytes + 64);
    let mut width = 0;
    while text.len() < bytes {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let word = WORDS[(state >> 33) as usize % WORDS.len()];
        if line > 0 && width + word.len() > line {
            text.push('\n');
            width = 0;
        } else if width > 0 {
            text.push(' ');
        }
        text.push_str(word);
        width += word.len() + 1;
    }
    text
}

/// A document is cut into pieces only where the ids do not change: the
/// corpus's ids are those of the whole text encoded at once (the ids before
/// documents were cut), for GPT-2 and a Hugging Face tokenizer, on one line
/// and on short lines.
#[test]
fn pieces_give_the_ids_of_the_whole_text() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer");
    let tokenizers = [
        Tokenizer::from_name("gpt2").unwrap(),
        Tokenizer::from_name(fixture.to_str().unwrap()).unwrap(),
    ];
    for (i, line) in [0, 80].into_iter().enumerate() {
        let text = varied_text(12 * PIECE_BYTES, line);
        let file = dir.path().join(format!("text-{i}.txt"));
        write(&file, &text);
        for tokenizer in &tokenizers {
            let pieces: Vec<&str> = pieces(&text, tokenizer).collect();
            assert!(
                pieces.len() >= 10,
                "{}: {} pieces",
                tokenizer.name(),
                pieces.len()
            );
            assert_eq!(pieces.concat(), text);
            let tokenized = tokenize(&file, tokenizer, &dir.path().join("cache")).unwrap();
            assert_eq!(tokenized.forced_cuts, 0);
            assert!(
                ids(&tokenized.tokens) == tokenizer.encode(&text),
                "{} on lines of {line}: ids differ from the whole text's",
                tokenizer.name()
            );
        }
    }
}

/// A tokenizer that prefixes every input (SentencePiece's `▁`, as Llama 2's
/// tokenizer.json does with a `Prepend` normalizer and no pre-tokenizer)
/// gives other ids on either side of a cut: no cut is made below
/// MAX_PIECE_BYTES, and past it a cut is made anyway and counted.
#[test]
fn a_tokenizer_that_prefixes_its_input_is_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let json = r#"{
      "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
      "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
      "pre_tokenizer": null, "post_processor": null, "decoder": null,
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
        "continuing_subword_prefix": null, "end_of_word_suffix": null,
        "fuse_unk": false, "byte_fallback": false,
        "vocab": {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "▁b": 5},
        "merges": ["▁ a", "▁ b"]}
    }"#;
    let path = dir.path().join("tokenizer.json");
    write(&path, json);
    let prefixing = Tokenizer::from_name(path.to_str().unwrap()).unwrap();
    let words = ["ab", "ba", "a", "bb"];
    let text: String = (0..MAX_PIECE_BYTES / 2)
        .map(|i| words[i % words.len()])
        .collect::<Vec<_>>()
        .join(" ");
    let mut cut = pieces(&text[..3 * PIECE_BYTES], &prefixing);
    assert_eq!(cut.by_ref().count(), 1, "cut although the ids change");
    assert_eq!(cut.forced, 0);
    let long = &text[..MAX_PIECE_BYTES + 10];
    let mut cut = pieces(long, &prefixing);
    assert_eq!(cut.by_ref().count(), 2);
    assert_eq!(cut.forced, 1, "a cut past MAX_PIECE_BYTES is counted");
}
