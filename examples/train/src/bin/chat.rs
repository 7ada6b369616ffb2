//! `chat`: talks with a model folder: a Hugging Face folder or a checkpoint
//! of `train`. Each turn is rendered with the tokenizer's chat template and
//! its generation prompt, and the reply is streamed as it is generated,
//! with a key/value cache on the device. `--prompt` answers once and exits;
//! otherwise each line on stdin is a turn.

use std::convert::Infallible;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use burn_offload::{Compute, StreamedModel};
use clap::Parser;
use models::{CachedModel, LoraModel, ModelConfig};
use trainer::chat::{ChatTemplate, Message};
use trainer::error_line::print_error;
use trainer::generate::{
    generate, Cached, Decoder, Ended, Generation, Recompute, Request, Stops, Streamed,
};
use trainer::load::{ModelFolder, Weights};
use trainer::options::TrainOptions;
use trainer::sample::last_logits;
use trainer::sampling::{Sampler, Sampling};
use trainer::DefaultBackend as B;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Chat with a model: a Hugging Face folder or a checkpoint of train (burn-offload)",
    long_about = "Chat with a model: a Hugging Face folder or a checkpoint of train (burn-offload).\n\n\
Each turn is rendered with the tokenizer's chat template (with its generation prompt) and the \
reply is streamed as it is generated: the prompt runs once, then one position per token, with a \
key/value cache on the device. With --prompt it answers once and exits; otherwise each line on \
stdin is a turn (/reset forgets the conversation, /quit or end of input ends it).\n\n\
A model that does not fit the GPU (or with --streamed) runs as training runs it: its weights \
stay in host memory and each block visits the GPU in turn for every token (the key/value cache \
stays on the GPU): correct, and slow.",
    allow_negative_numbers = true
)]
struct Cli {
    /// A Hugging Face model folder (config.json, *.safetensors and
    /// tokenizer.json), or a checkpoint of `train --checkpoint-dir` (a
    /// step-<N> folder, or the folder holding them: the newest).
    model: PathBuf,
    /// Answer this prompt and exit (the reply on stdout, timings on stderr).
    #[arg(long)]
    prompt: Option<String>,
    /// A system message that starts the conversation.
    #[arg(long)]
    system: Option<String>,
    /// No chat template: the prompt is text to continue.
    #[arg(long)]
    raw: bool,
    /// Tokenizer: `byte`, `gpt2` or a tokenizer.json (the file or its
    /// folder). Default: the model folder's tokenizer.json, or the one a
    /// checkpoint names (byte and gpt2 only; give a tokenizer.json here).
    #[arg(long)]
    tokenizer: Option<String>,
    /// Tokens to generate at most per reply.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 takes the most likely token (greedy).
    #[arg(long, default_value_t = 0.7)]
    temperature: f64,
    /// Draw among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Draw among the most likely tokens whose probabilities reach P (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Penalise the tokens already in the conversation (1: none; 1.1 is usual).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f64,
    /// Seed of the sampler: the same seed draws the same tokens.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Text that ends a reply (repeatable); the end-of-sequence and
    /// end-of-turn tokens of the model's tokenizer end it too.
    #[arg(long = "stop", value_name = "TEXT")]
    stops: Vec<String>,
    /// The precision the device computes in: fp32, or bf16 (the default on
    /// CUDA; the weights are cast once).
    #[arg(long)]
    compute: Option<Compute>,
    /// Stream the blocks from host memory for every token, as training
    /// does, instead of holding the model on the GPU (chosen by itself when
    /// the model does not fit). Slow.
    #[arg(long)]
    streamed: bool,
    /// Run the whole conversation again for each token instead of keeping
    /// the key/value cache (a check of the cache: the same tokens, slower).
    #[arg(long, conflicts_with = "streamed")]
    no_cache: bool,
    /// GPU memory the model may use, in GiB (default: free memory on GPU 0).
    #[arg(long)]
    gpu_mem_gib: Option<f64>,
    /// With --prompt: answer it this many times, each from an empty
    /// context, with the timings of each (the first run compiles the GPU's
    /// kernels: benchmarks read the last).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// PEFT adapters to apply to the model (a folder with
    /// adapter_config.json and adapter_model.safetensors, as `train
    /// --export-peft` and PEFT write them), merged into its weights.
    #[arg(long)]
    adapter: Option<PathBuf>,
}

/// What a conversation needs besides its model.
struct Session {
    cli: Cli,
    folder: ModelFolder,
    template: Option<ChatTemplate>,
    stops: Stops,
    compute: Compute,
    device: burn::tensor::Device<B>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            print_error("", err.as_ref());
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    sampling(&cli).validate()?;
    if cli.repeat == 0 || (cli.repeat > 1 && cli.prompt.is_none()) {
        anyhow::bail!("--repeat takes a count of at least 1, and repeats --prompt");
    }
    #[cfg(feature = "cuda")]
    trainer::preflight::cuda_driver()?;
    let mut folder = ModelFolder::open(&cli.model, cli.tokenizer.as_deref())?;
    if let Some(dir) = &cli.adapter {
        folder = folder.with_adapter(dir)?;
    }
    let tokenizer = &folder.tokenizer;
    let template = match cli.raw {
        true => None,
        false => Some(ChatTemplate::new(
            tokenizer.chat_template(),
            &tokenizer.specials(),
        )?),
    };
    burn_offload::set_matmul(burn_offload::DEFAULT_MATMUL)
        .map_err(|why| anyhow::anyhow!("matmul: {why}"))?;
    #[cfg(feature = "cuda")]
    burn_offload::ops::attention::set_cudnn_attention(true);
    let device = Default::default();
    let compute = cli.compute.unwrap_or(match cfg!(feature = "cuda") {
        true => Compute::Bf16,
        false => Compute::Fp32,
    });
    compute
        .check::<B>(&device)
        .map_err(|why| anyhow::anyhow!("--compute {compute}: {why}"))?;
    let stops = Stops {
        ids: folder.stop_ids.clone(),
        strings: cli.stops.clone(),
    };
    let config = folder.config.clone();
    let session = Session {
        cli,
        folder,
        template,
        stops,
        compute,
        device,
    };
    match &config {
        ModelConfig::Llama(c) => session.start(|| c.init::<B>(&session.device)),
        ModelConfig::Gpt2(c) => session.start(|| c.init::<B>(&session.device)),
    }
}

fn sampling(cli: &Cli) -> Sampling {
    Sampling {
        temperature: cli.temperature,
        top_k: cli.top_k,
        top_p: cli.top_p,
        repetition_penalty: cli.repetition_penalty,
        seed: cli.seed,
    }
}

impl Session {
    /// Loads the model, resident with its cache where it fits, streamed
    /// otherwise, and talks.
    fn start<M>(&self, init: impl FnOnce() -> M) -> anyhow::Result<()>
    where
        M: StreamedModel<B> + CachedModel<B> + LoraModel<B>,
    {
        let config = &self.folder.config;
        let context = config.max_seq_len();
        // Room for a one-shot prompt and its reply, or a conversation's
        // first turns; the cache grows if a conversation needs more.
        let capacity = (self.cli.max_new_tokens + 1024).min(context);
        let dtype_bytes = match self.compute {
            Compute::Fp32 => 4,
            _ => 2,
        };
        // The weights arrive in f32 and are cast one tensor at a time.
        let need = config.num_params() as u64 * 4
            + cache_bytes(config, capacity) * dtype_bytes
            + (1 << 30);
        let machine = trainer::run::machine(&TrainOptions {
            gpu_mem_gib: self.cli.gpu_mem_gib,
            ..TrainOptions::default()
        })?;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let what = match &self.folder.weights {
            Weights::Hf(dir) => format!("`{}`", dir.display()),
            Weights::Checkpoint(path) => format!("checkpoint `{}`", path.display()),
        };
        let params = trainer::progress::human_count(config.num_params());
        let streamed = match (self.cli.streamed, machine.device_bytes) {
            (true, _) => Some("--streamed".to_string()),
            (false, Some(free)) if need > free => Some(format!(
                "the model needs {:.1} GiB on the GPU and {:.1} GiB are {}",
                gib(need),
                gib(free),
                machine.device_source
            )),
            _ => None,
        };
        match streamed {
            Some(_)
                if self.folder.adapter.is_some()
                    && matches!(self.folder.weights, Weights::Checkpoint(_)) =>
            {
                Err(trainer::load::LoadError::StreamedAdapter.into())
            }
            Some(why) => {
                eprintln!(
                    "{what}: {params} parameters, {}, streamed ({why}): its weights stay in host \
                     memory and each block visits the device in turn for every token, as in \
                     training, with the key/value cache on the device: slow",
                    self.compute
                );
                let engine = self
                    .folder
                    .engine::<B, M>(init, self.compute, &self.device)?;
                self.talk(Streamed::new(engine, capacity, context))
            }
            None if self.cli.no_cache => {
                let model = self
                    .folder
                    .resident::<B, M>(init, self.compute, &self.device)?;
                eprintln!(
                    "{what}: {params} parameters, {}, on the device without a cache \
                     (--no-cache): each token runs the whole conversation again",
                    self.compute
                );
                let forward = |tokens| Ok::<_, Infallible>(last_logits(&model, tokens));
                self.talk(Recompute::new(forward, context, &self.device))
            }
            None => {
                let model = self
                    .folder
                    .resident::<B, M>(init, self.compute, &self.device)?;
                eprintln!(
                    "{what}: {params} parameters, {}, on the device with a key/value cache",
                    self.compute
                );
                self.talk(Cached::new(model, capacity, context, &self.device))
            }
        }
    }

    /// One reply for `--prompt`, or a turn per line of stdin.
    fn talk<D>(&self, mut decoder: D) -> anyhow::Result<()>
    where
        D: Decoder<B>,
        anyhow::Error: From<D::Error>,
    {
        let mut messages: Vec<Message> = self
            .cli
            .system
            .iter()
            .map(|s| Message::new("system", s))
            .collect();
        if let Some(prompt) = &self.cli.prompt {
            messages.push(Message::new("user", prompt));
            for _ in 0..self.cli.repeat {
                decoder.truncate(0);
                let reply = self.reply(&mut decoder, &messages)?;
                report(&reply, true);
            }
            return Ok(());
        }
        let interactive = std::io::stdin().is_terminal();
        let ask = || {
            if interactive {
                eprint!("> ");
                let _ = std::io::stderr().flush();
            }
        };
        ask();
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            match line.trim() {
                "" => {}
                "/quit" | "/exit" => break,
                "/reset" => messages.retain(|m| m.role == "system"),
                text => {
                    messages.push(Message::new("user", text));
                    let reply = self.reply(&mut decoder, &messages)?;
                    report(&reply, false);
                    messages.push(Message::new("assistant", &reply.text));
                    if self.cli.raw {
                        messages.retain(|m| m.role == "system");
                    }
                }
            }
            ask();
        }
        Ok(())
    }

    /// Generates the reply to `messages`, printing it as it grows.
    fn reply<D>(&self, decoder: &mut D, messages: &[Message]) -> anyhow::Result<Generation>
    where
        D: Decoder<B>,
        anyhow::Error: From<D::Error>,
    {
        let tokenizer = &self.folder.tokenizer;
        let prompt = match &self.template {
            Some(template) => tokenizer.encode(&template.render(messages, true)?),
            // Raw: the last message is the text to continue.
            None => tokenizer.encode(messages.last().map_or("", |m| m.content.as_str())),
        };
        let request = Request {
            prompt: &prompt,
            max_new_tokens: self.cli.max_new_tokens,
            stops: &self.stops,
            slide: false,
        };
        let mut sampler = Sampler::new(sampling(&self.cli));
        let mut stdout = std::io::stdout();
        let reply = generate(decoder, &mut sampler, tokenizer, &request, |text| {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        })?;
        println!();
        if reply.ended == Ended::Context {
            eprintln!(
                "the conversation fills the model's context of {} tokens{}",
                decoder.context(),
                if self.cli.prompt.is_none() {
                    ": /reset to start again"
                } else {
                    ""
                }
            );
        }
        Ok(reply)
    }
}

/// The reply's timings on stderr (always for `--prompt`, else only when
/// asked to be verbose by a non-interactive run).
fn report(reply: &Generation, one_shot: bool) {
    if !one_shot {
        return;
    }
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.0} tok/s); decode: {} tokens in {:.3} s ({:.1} tok/s)",
        reply.prefilled,
        reply.prefill_s,
        reply.prefill_tokens_per_s(),
        reply.ids.len().saturating_sub(1),
        reply.decode_s,
        reply.decode_tokens_per_s()
    );
}

/// Values a key/value cache of `positions` holds, keys and values of
/// every block.
fn cache_bytes(config: &ModelConfig, positions: usize) -> u64 {
    let width = match config {
        ModelConfig::Llama(c) => c.n_kv_head * c.head_dim(),
        ModelConfig::Gpt2(c) => c.d_model,
    };
    (2 * config.n_layer() * width * positions) as u64
}
