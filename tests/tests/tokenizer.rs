//! Hugging Face tokenizers against what `transformers` made of the committed
//! fixture (tests/fixtures/tokenizer.py): ids, special tokens, decoding.

use std::path::{Path, PathBuf};

use trainer::chat::{ChatTemplate, Message};
use trainer::tokenizer::{HfTokenizer, Tokenizer, TokenizerError};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tokenizer")
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
        .unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn ids_match_transformers_on_unicode_whitespace_and_special_tokens() {
    let want = expected();
    let hf = HfTokenizer::open(&fixture()).unwrap();
    let tokenizer = Tokenizer::from_name(fixture().to_str().unwrap()).unwrap();
    assert_eq!(
        tokenizer.vocab_size(),
        want["vocab_size"].as_u64().unwrap() as usize
    );
    assert!(tokenizer.name().starts_with("hf-"), "{}", tokenizer.name());
    for case in want["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tokenizer.encode(text), ids(&case["ids"]), "{text:?}");
        assert_eq!(
            hf.encode(text, true),
            ids(&case["ids_with_special"]),
            "{text:?} with special tokens"
        );
        assert_eq!(
            tokenizer.decode(&ids(&case["ids"])),
            text,
            "decode {text:?}"
        );
    }
    let specials = tokenizer.specials();
    assert_eq!(
        specials.bos.map(|s| s.id as u64),
        want["bos_token_id"].as_u64()
    );
    assert_eq!(
        specials.eos.map(|s| s.id as u64),
        want["eos_token_id"].as_u64()
    );
    // An id past the vocabulary decodes as U+FFFD instead of failing.
    let hello = tokenizer.encode("Hello");
    let decoded = tokenizer.decode(&[&hello[..], &[1_000_000]].concat());
    assert_eq!(decoded, "Hello\u{FFFD}");
}

#[test]
fn the_tokenizer_comes_with_init_from_unless_named() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture().join(file), dir.path().join(file)).unwrap();
    }
    let taken = Tokenizer::for_run(None, Some(dir.path())).unwrap();
    assert!(taken.name().starts_with("hf-"));
    let named = Tokenizer::for_run(Some("byte"), Some(dir.path())).unwrap();
    assert_eq!(named.name(), "byte");
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        Tokenizer::for_run(None, Some(empty.path())).unwrap().name(),
        "byte"
    );
}

#[test]
fn missing_or_malformed_tokenizer_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = HfTokenizer::open(dir.path()).err().unwrap();
    assert!(matches!(err, TokenizerError::Missing(_)), "{err}");
    assert!(err.to_string().contains("no tokenizer.json in"), "{err}");

    std::fs::write(dir.path().join("tokenizer.json"), b"{\"model\": 3").unwrap();
    let err = HfTokenizer::open(dir.path()).err().unwrap();
    assert!(matches!(err, TokenizerError::Invalid { .. }), "{err}");
    assert_eq!(err.to_string().lines().count(), 1);

    std::fs::copy(
        fixture().join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        br#"{"eos_token": "<|no_such_token|>"}"#,
    )
    .unwrap();
    let err = HfTokenizer::open(dir.path()).err().unwrap();
    assert!(
        err.to_string()
            .contains("eos_token `<|no_such_token|>` is not in the tokenizer's vocabulary"),
        "{err}"
    );
}

fn messages(v: &serde_json::Value) -> Vec<Message> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

#[test]
fn the_chat_template_renders_as_transformers_renders_it() {
    let want = expected();
    let tokenizer = Tokenizer::from_name(fixture().to_str().unwrap()).unwrap();
    let template = ChatTemplate::new(tokenizer.chat_template(), &tokenizer.specials()).unwrap();
    for chat in want["chat"].as_array().unwrap() {
        let generation = chat["add_generation_prompt"].as_bool().unwrap();
        let text = template
            .render(&messages(&chat["messages"]), generation)
            .unwrap();
        assert_eq!(text, chat["text"].as_str().unwrap());
        assert_eq!(tokenizer.encode(&text), ids(&chat["ids"]));
    }
}

#[test]
fn assistant_spans_hold_each_reply_and_its_end_of_turn() {
    let tokenizer = Tokenizer::from_name(fixture().to_str().unwrap()).unwrap();
    let template = ChatTemplate::new(tokenizer.chat_template(), &tokenizer.specials()).unwrap();
    let chat = messages(&expected()["chat"][2]["messages"]);
    let (text, spans) = template.render_with_spans(&chat).unwrap();
    let replies: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
    assert_eq!(replies, ["Both.<|eot_id|>", "Because.<|eot_id|>"]);

    // The plain template, for tokenizers without one.
    let plain = ChatTemplate::new(None, &tokenizer.specials()).unwrap();
    let (text, spans) = plain.render_with_spans(&chat).unwrap();
    assert!(text.starts_with("<|begin_of_text|>### User:\nZürich or 東京?\n\n### Assistant:\n"));
    assert_eq!(&text[spans[0].clone()], "Both.<|eot_id|>\n\n");
}

#[test]
fn a_template_that_fails_to_render_is_a_clear_error() {
    let specials = Default::default();
    let err = ChatTemplate::new(Some("{% for m in messages %}"), &specials)
        .err()
        .unwrap();
    assert!(err.to_string().contains("does not compile"), "{err}");
    let raising = ChatTemplate::new(
        Some("{{ raise_exception('Conversation roles must alternate') }}"),
        &specials,
    )
    .unwrap();
    let err = raising.render(&[], false).unwrap_err().to_string();
    assert!(
        err.contains("fails to render") && err.contains("Conversation roles must alternate"),
        "{err}"
    );
}
