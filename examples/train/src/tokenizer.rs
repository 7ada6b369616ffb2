//! Tokenizers: byte-level, GPT-2's BPE (tiktoken, no download), and Hugging
//! Face `tokenizer.json` files (the `tokenizers` crate, without its network
//! features) with the special tokens and chat template of the checkpoint they
//! come with.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Vocabulary size of the GPT-2 (`r50k_base`) encoding: 50256 BPE ranks plus
/// the `<|endoftext|>` special token.
pub const GPT2_VOCAB_SIZE: usize = 50257;

/// Names accepted by [`Tokenizer::from_name`] besides a `tokenizer.json` path.
pub const TOKENIZER_NAMES: [&str; 2] = ["byte", "gpt2"];

/// The file a Hugging Face checkpoint keeps its tokenizer in.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unknown tokenizer `{0}` (expected byte, gpt2, or a tokenizer.json file or folder)")]
    Unknown(String),
    #[error("cannot load the GPT-2 tokenizer: {0}")]
    Gpt2(String),
    #[error("no tokenizer.json in `{}`", .0.display())]
    Missing(PathBuf),
    #[error("`{}` is not a usable tokenizer: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("`{}`: {what} `{token}` is not in the tokenizer's vocabulary", path.display())]
    UnknownSpecial {
        path: PathBuf,
        what: &'static str,
        token: String,
    },
}

/// A text tokenizer.
pub enum Tokenizer {
    /// One token per UTF-8 byte (vocabulary 256).
    Byte,
    /// GPT-2 BPE (`r50k_base`), vocabulary [`GPT2_VOCAB_SIZE`]. Construct it
    /// with [`Tokenizer::from_name`]; `decode` assumes this encoding.
    Gpt2(Box<tiktoken_rs::CoreBPE>),
    /// A Hugging Face `tokenizer.json`.
    HuggingFace(Box<HfTokenizer>),
}

/// A special token and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Special {
    pub token: String,
    pub id: u32,
}

/// The beginning/end-of-sequence and padding tokens a checkpoint names
/// (`tokenizer_config.json`, else the ids in `config.json` and
/// `generation_config.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<Special>,
    pub eos: Option<Special>,
    pub pad: Option<Special>,
}

/// A Hugging Face tokenizer with what its checkpoint says about it.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The files it was read from (tokenizer.json, and its config when present).
    files: Vec<PathBuf>,
    name: String,
    vocab_size: usize,
    specials: SpecialTokens,
    chat_template: Option<String>,
    /// The file the chat template was read from.
    template_file: Option<PathBuf>,
    /// The flag that named the tokenizer: `--tokenizer`, or `--init-from`
    /// for the checkpoint's own.
    origin: &'static str,
}

impl HfTokenizer {
    /// Reads `path` (a `tokenizer.json`, or a folder holding one beside its
    /// `tokenizer_config.json`, `config.json` and `generation_config.json`).
    pub fn open(path: &Path) -> Result<Self, TokenizerError> {
        let (file, dir) = if path.is_dir() {
            (path.join(TOKENIZER_FILE), path.to_path_buf())
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (path.to_path_buf(), dir)
        };
        if !file.is_file() {
            return Err(TokenizerError::Missing(dir));
        }
        let invalid = |reason: String| TokenizerError::Invalid {
            path: file.clone(),
            reason,
        };
        let bytes = std::fs::read(&file).map_err(|e| invalid(e.to_string()))?;
        let mut inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| invalid(e.to_string()))?;
        // A tokenizer.json may carry the truncation and padding its model was
        // served with (e.g. 512 tokens); a corpus is tokenized whole.
        inner
            .with_truncation(None)
            .map_err(|e| invalid(e.to_string()))?
            .with_padding(None);
        // Added tokens may sit above the model's own vocabulary.
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1);
        let read = |name: &str| -> Result<Option<Value>, TokenizerError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(text.trim_start_matches('\u{feff}'))
                    .map(Some)
                    .map_err(|e| TokenizerError::Invalid {
                        path,
                        reason: format!("invalid JSON: {e}"),
                    }),
                Err(_) => Ok(None),
            }
        };
        let tokenizer_config = read("tokenizer_config.json")?;
        let model_config = read("config.json")?;
        let generation_config = read("generation_config.json")?;
        let config_path = dir.join("tokenizer_config.json");
        let special = |what: &'static str, key: &str| -> Result<Option<Special>, TokenizerError> {
            // `"eos_token": "</s>"` or `{"content": "</s>", ...}`.
            let named = tokenizer_config
                .as_ref()
                .and_then(|c| c.get(key))
                .and_then(|v| {
                    v.as_str()
                        .or_else(|| v.get("content").and_then(Value::as_str))
                        .map(str::to_owned)
                });
            if let Some(token) = named {
                let id =
                    inner
                        .token_to_id(&token)
                        .ok_or_else(|| TokenizerError::UnknownSpecial {
                            path: config_path.clone(),
                            what,
                            token: token.clone(),
                        })?;
                return Ok(Some(Special { token, id }));
            }
            // An id (or the first of a list of ids) in config.json or
            // generation_config.json.
            let id_key = format!("{key}_id");
            let id = [&generation_config, &model_config]
                .into_iter()
                .flatten()
                .filter_map(|c| c.get(&id_key))
                .find_map(|v| v.as_u64().or_else(|| v.get(0).and_then(Value::as_u64)));
            Ok(id.and_then(|id| {
                inner.id_to_token(id as u32).map(|token| Special {
                    token,
                    id: id as u32,
                })
            }))
        };
        let specials = SpecialTokens {
            bos: special("bos_token", "bos_token")?,
            eos: special("eos_token", "eos_token")?,
            pad: special("pad_token", "pad_token")?,
        };
        // transformers writes the template to its own file (and reads it
        // from there first); older checkpoints keep it in the config.
        let jinja = dir.join("chat_template.jinja");
        let from_jinja = match std::fs::read_to_string(&jinja) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(TokenizerError::Invalid {
                    path: jinja,
                    reason: e.to_string(),
                })
            }
        };
        let from_config = tokenizer_config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(|t| match t {
                Value::String(s) => Some(s.clone()),
                // A list of named templates: the default one.
                Value::Array(list) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            });
        let (chat_template, template_file) = match (from_jinja, from_config) {
            (Some(text), _) => (Some(text), Some(jinja)),
            (None, Some(text)) => (Some(text), Some(config_path.clone())),
            (None, None) => (None, None),
        };
        let files = std::iter::once(file.clone())
            .chain(
                [
                    "tokenizer_config.json",
                    "special_tokens_map.json",
                    "chat_template.jinja",
                ]
                .map(|name| dir.join(name))
                .into_iter()
                .filter(|p| p.is_file()),
            )
            .collect();
        Ok(Self {
            inner,
            files,
            name: format!("hf-{:08x}", crc32fast::hash(&bytes)),
            vocab_size,
            specials,
            chat_template,
            template_file,
            origin: "--tokenizer",
        })
    }

    /// Ids of `text`, with the special tokens the post-processor adds when
    /// `special` (a BOS, for Llama 3's).
    pub fn encode(&self, text: &str, special: bool) -> Vec<u32> {
        // `encode_fast`: the ids of `encode`, without converting offsets.
        self.inner
            .encode_fast(text, special)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

impl fmt::Debug for Tokenizer {
    // `CoreBPE` has no `Debug`, and dumping 50k merges would be useless anyway.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokenizer({})", self.name())
    }
}

impl Tokenizer {
    /// Builds the tokenizer called `name`: `"byte"`, `"gpt2"`, or a Hugging
    /// Face `tokenizer.json` (the file, or a folder holding it).
    pub fn from_name(name: &str) -> Result<Tokenizer, TokenizerError> {
        match name {
            "byte" => Ok(Tokenizer::Byte),
            "gpt2" => tiktoken_rs::r50k_base()
                .map(|bpe| Tokenizer::Gpt2(Box::new(bpe)))
                .map_err(|e| TokenizerError::Gpt2(e.to_string())),
            path if Path::new(path).exists() => {
                HfTokenizer::open(Path::new(path)).map(|t| Tokenizer::HuggingFace(Box::new(t)))
            }
            other => Err(TokenizerError::Unknown(other.to_owned())),
        }
    }

    /// The tokenizer of a run: `--tokenizer` when given, else the
    /// `tokenizer.json` of the `--init-from` checkpoint when it has one, else
    /// byte-level.
    pub fn for_run(
        name: Option<&str>,
        init_from: Option<&Path>,
    ) -> Result<Tokenizer, TokenizerError> {
        match (name, init_from) {
            (Some(name), _) => Self::from_name(name),
            (None, Some(dir)) if dir.join(TOKENIZER_FILE).is_file() => {
                HfTokenizer::open(dir).map(|t| {
                    Tokenizer::HuggingFace(Box::new(HfTokenizer {
                        origin: "--init-from",
                        ..t
                    }))
                })
            }
            (None, _) => Ok(Tokenizer::Byte),
        }
    }

    /// What identifies the tokenizer in checkpoints: `byte`, `gpt2`, or
    /// `hf-<CRC32 of tokenizer.json>` (a resume must tokenize as the run did,
    /// wherever the file now lies).
    pub fn name(&self) -> &str {
        match self {
            Tokenizer::Byte => "byte",
            Tokenizer::Gpt2(_) => "gpt2",
            Tokenizer::HuggingFace(t) => &t.name,
        }
    }

    /// Number of distinct token ids; every id from `encode` is below this.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Byte => 256,
            Tokenizer::Gpt2(_) => GPT2_VOCAB_SIZE,
            Tokenizer::HuggingFace(t) => t.vocab_size,
        }
    }

    /// The special tokens the checkpoint's configs name (none for byte and
    /// GPT-2 here).
    pub fn specials(&self) -> SpecialTokens {
        match self {
            Tokenizer::HuggingFace(t) => t.specials.clone(),
            _ => SpecialTokens::default(),
        }
    }

    /// The id of the token written `token` (a Hugging Face tokenizer's
    /// vocabulary or added tokens; none for byte and GPT-2 here).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match self {
            Tokenizer::HuggingFace(t) => t.inner.token_to_id(token),
            _ => None,
        }
    }

    /// The files a Hugging Face tokenizer was read from, to ship beside an
    /// exported model (none for byte and GPT-2).
    pub fn files(&self) -> &[PathBuf] {
        match self {
            Tokenizer::HuggingFace(t) => &t.files,
            _ => &[],
        }
    }

    /// The checkpoint's chat template (`chat_template.jinja`, else
    /// `tokenizer_config.json`'s), if any.
    pub fn chat_template(&self) -> Option<&str> {
        match self {
            Tokenizer::HuggingFace(t) => t.chat_template.as_deref(),
            _ => None,
        }
    }

    /// Which chat template a conversation is rendered with, for messages:
    /// its file and the flag that named it, or the plain template.
    pub fn template_origin(&self) -> String {
        match self {
            Tokenizer::HuggingFace(t) => match &t.template_file {
                Some(file) => format!(
                    "the chat template of `{}` (from {})",
                    file.display(),
                    t.origin
                ),
                None => format!(
                    "the plain chat template (`{}` from {} has none)",
                    t.files[0].display(),
                    t.origin
                ),
            },
            _ => format!(
                "the plain chat template (the {} tokenizer has none)",
                self.name()
            ),
        }
    }

    /// Encodes `text` as plain text: no special tokens are added, and GPT-2
    /// treats a literal `<|endoftext|>` as plain characters. A Hugging Face
    /// tokenizer recognises its added tokens where they appear in the text
    /// (a rendered chat template writes them).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Byte => text.bytes().map(u32::from).collect(),
            Tokenizer::Gpt2(bpe) => bpe.encode_ordinary(text),
            Tokenizer::HuggingFace(t) => t.encode(text, false),
        }
    }

    /// Whether encoding `text[..at]` and `text[at..]` apart gives the ids of
    /// encoding `text` whole, judged on the `margin` bytes on each side of
    /// `at` (a char boundary): a tokenizer that splits its input before it
    /// merges (byte-level BPE, whitespace pre-tokenizers) gives the same ids
    /// on either side of such a split; one that prefixes every input (a
    /// SentencePiece `▁`) does not.
    pub fn cuts_cleanly(&self, text: &str, at: usize, margin: usize) -> bool {
        // Bytes are tokens; GPT-2 encodes the pieces its regex splits the
        // text into one by one, and none of them holds a non-space followed
        // by a space, or a line break followed by a non-space.
        if let Tokenizer::Byte | Tokenizer::Gpt2(_) = self {
            return true;
        }
        let mut from = at.saturating_sub(margin);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let mut to = (at + margin).min(text.len());
        while !text.is_char_boundary(to) {
            to += 1;
        }
        let mut apart = self.encode(&text[from..at]);
        apart.extend(self.encode(&text[at..to]));
        apart == self.encode(&text[from..to])
    }

    /// [`Tokenizer::encode`] with the byte offset in `text` where each
    /// token starts.
    pub fn encode_with_starts(&self, text: &str) -> (Vec<u32>, Vec<usize>) {
        match self {
            Tokenizer::Byte => (self.encode(text), (0..text.len()).collect()),
            Tokenizer::Gpt2(bpe) => {
                let ids = bpe.encode_ordinary(text);
                let mut starts = Vec::with_capacity(ids.len());
                let mut at = 0;
                for piece in bpe._decode_native_and_split(ids.clone()) {
                    starts.push(at);
                    at += piece.len();
                }
                (ids, starts)
            }
            Tokenizer::HuggingFace(t) => match t.inner.encode(text, false) {
                Ok(encoding) => (
                    encoding.get_ids().to_vec(),
                    encoding
                        .get_offsets()
                        .iter()
                        .map(|&(start, _)| start)
                        .collect(),
                ),
                Err(_) => (Vec::new(), Vec::new()),
            },
        }
    }

    /// Decodes `ids` to text. Never fails: invalid UTF-8 (e.g. a sample cut in
    /// the middle of a character) and out-of-vocabulary ids become U+FFFD, so
    /// model samples can always be printed.
    pub fn decode(&self, ids: &[u32]) -> String {
        const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();
        match self {
            Tokenizer::HuggingFace(t) => {
                // Unknown ids would make the library fail: they print as U+FFFD.
                let mut text = String::new();
                for run in ids.split_inclusive(|&id| id as usize >= t.vocab_size) {
                    let (known, unknown) = match run.split_last() {
                        Some((&last, rest)) if last as usize >= t.vocab_size => (rest, true),
                        _ => (run, false),
                    };
                    text.push_str(&t.inner.decode(known, false).unwrap_or_default());
                    if unknown {
                        text.push('\u{FFFD}');
                    }
                }
                text
            }
            Tokenizer::Byte => {
                let mut bytes = Vec::with_capacity(ids.len());
                for &id in ids {
                    match u8::try_from(id) {
                        Ok(b) => bytes.push(b),
                        Err(_) => bytes.extend_from_slice(REPLACEMENT),
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Tokenizer::Gpt2(bpe) => {
                // Fast path: the common case is valid ids forming valid UTF-8.
                if let Ok(text) = bpe.decode(ids.to_vec()) {
                    return text;
                }
                // `_decode_native_and_split` is the only public byte-level
                // decoder, and it panics on unknown ids, so only ids inside the
                // (dense) GPT-2 vocabulary are passed to it.
                let mut bytes = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    if (id as usize) < GPT2_VOCAB_SIZE {
                        for piece in bpe._decode_native_and_split(vec![id]) {
                            bytes.extend_from_slice(&piece);
                        }
                    } else {
                        bytes.extend_from_slice(REPLACEMENT);
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokenizer_round_trip() {
        let tok = Tokenizer::from_name("byte").expect("byte");
        assert_eq!(tok.name(), "byte");
        assert_eq!(tok.vocab_size(), 256);
        let text = "Hello, world! caf\u{e9} \u{1F600}";
        let ids = tok.encode(text);
        assert_eq!(ids.len(), text.len());
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        assert_eq!(tok.decode(&ids), text);
        // Cut in the middle of a multi-byte character, plus an out-of-range id.
        assert_eq!(tok.decode(&[104, 0xc3, 300]), "h\u{FFFD}\u{FFFD}");
    }

    #[test]
    fn gpt2_tokenizer_round_trip() {
        let tok = Tokenizer::from_name("gpt2").expect("gpt2");
        assert_eq!(tok.name(), "gpt2");
        assert_eq!(tok.vocab_size(), 50257);
        let ids = tok.encode("Hello world");
        assert_eq!(ids, vec![15496, 995]);
        assert_eq!(tok.decode(&ids), "Hello world");
        // Special tokens are not recognised in training text.
        assert!(!tok.encode("<|endoftext|>").contains(&50256));
        // Out-of-vocabulary ids and split characters do not panic.
        assert_eq!(tok.decode(&[15496, 1_000_000, 995]), "Hello\u{FFFD} world");
        let emoji = tok.encode("\u{1F600}");
        assert!(emoji.len() > 1);
        assert!(tok.decode(&emoji[..1]).contains('\u{FFFD}'));
    }

    #[test]
    fn unknown_tokenizer_is_rejected() {
        let err = Tokenizer::from_name("sentencepiece").unwrap_err();
        assert!(matches!(err, TokenizerError::Unknown(ref n) if n == "sentencepiece"));
        assert!(err.to_string().contains("`sentencepiece`"));
    }
}
