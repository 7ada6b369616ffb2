//! Conversations rendered to text with a checkpoint's chat template (Jinja,
//! rendered with minijinja the way `transformers` renders it), or with a plain
//! template when the checkpoint has none, and the byte spans of the
//! assistant's turns, which are what instruction tuning trains on.

use std::ops::Range;

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use crate::tokenizer::SpecialTokens;

/// The template used when the tokenizer brings none: each turn headed by its
/// role, an assistant turn closed by the end-of-sequence token (when the
/// tokenizer has one) so that the model learns to stop.
pub const PLAIN_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message.role == 'assistant' %}### Assistant:\n{{ message.content }}{{ eos_token }}\n\n\
{% else %}### {{ message.role | capitalize }}:\n{{ message.content }}\n\n{% endif %}\
{% endfor %}{% if add_generation_prompt %}### Assistant:\n{% endif %}";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Why a conversation could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    #[error("the chat template fails to render: {0}")]
    Render(String),
    #[error(
        "the chat template does not render a conversation as the rendering of its first turns \
         followed by the next one, so the assistant's tokens cannot be told apart; \
         use --train-on-prompt"
    )]
    NotIncremental,
}

/// A compiled chat template with the special tokens it may write.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source` (the plain template when `None`).
    pub fn new(source: Option<&str>, specials: &SpecialTokens) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        // transformers' Jinja settings, and the helpers its templates call.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |_format: String| -> String {
            // Templates print today's date in system prompts; a fixed date
            // keeps the rendered data (and a resume's check of it) stable.
            "01 Jan 2025".to_string()
        });
        env.add_template_owned("chat", source.unwrap_or(PLAIN_TEMPLATE).to_string())
            .map_err(|e| ChatError::Compile(describe(&e)))?;
        let token = |s: &Option<crate::tokenizer::Special>| {
            s.as_ref().map(|s| s.token.clone()).unwrap_or_default()
        };
        Ok(Self {
            env,
            bos: token(&specials.bos),
            eos: token(&specials.eos),
        })
    }

    /// The conversation as text.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let template = self.env.get_template("chat").expect("added in new");
        template
            .render(context! {
                messages => minijinja::value::Serde(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos,
                eos_token => &self.eos,
            })
            .map_err(|e| ChatError::Render(describe(&e)))
    }

    /// The conversation as text with the byte ranges of its assistant turns:
    /// each from the end of the conversation before it (with the generation
    /// prompt) to the end of the conversation through it, so a turn's range
    /// holds its content and whatever closes it (the end-of-turn token).
    pub fn render_with_spans(
        &self,
        messages: &[Message],
    ) -> Result<(String, Vec<Range<usize>>), ChatError> {
        let full = self.render(messages, false)?;
        let mut spans = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if message.role != "assistant" {
                continue;
            }
            let before = self.render(&messages[..i], true)?;
            let through = self.render(&messages[..=i], false)?;
            if !through.starts_with(&before) || !full.starts_with(&through) {
                return Err(ChatError::NotIncremental);
            }
            spans.push(before.len()..through.len());
        }
        Ok((full, spans))
    }
}

/// minijinja's error with its cause, on one line.
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.replace('\n', " ")
}
