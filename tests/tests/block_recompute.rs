//! Per-block recompute for plain burn code: `BlockModel::forward` on
//! `Autodiff<Offload<B>>` runs each block as a checkpoint (only its input
//! kept, its graph rebuilt in the backward), and `burn_offload::recompute`
//! does the same for any function on any autodiff backend. Each is checked
//! against plain burn `Autodiff<B>` on the whole model: gradients, 20-step
//! losses, and a device peak that does not grow with depth. The counters
//! (recomputed blocks, device bytes, the prefetch trace) are process-wide:
//! the tests take turns ([`serial`]).

use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorPrimitive;
use burn_offload::residency::{self, reset_peak, set_param_cache_bytes};
use burn_offload::{
    prefetch, recompute, recomputed_blocks, BlockModel, BlockRecompute, DecoderBlock,
    HostOptimizerConfig, HostParams,
};
use burn_offload_tests::{
    random_tokens, rel_err, train_side_by_side, OffloadAutodiff as Off, ReadParams,
    TestAutodiff as Reference, TestBackend, WriteParams, TOL,
};
use models::{cross_entropy, Gpt2, Gpt2Config, Llama, LlamaConfig};

/// One test at a time in this binary (the counters are process-wide).
fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Blocks deep enough that a depth-independent peak means something.
const DEPTH: usize = 8;

fn llama(layers: usize) -> LlamaConfig {
    LlamaConfig {
        n_layer: layers,
        ..LlamaConfig::tiny()
    }
}

fn gpt2(layers: usize) -> Gpt2Config {
    Gpt2Config {
        n_layer: layers,
        ..Gpt2Config::tiny()
    }
}

/// The model on `Offload` (parameters born in host memory) and plain burn's
/// with the same weights.
fn pair<MO: Module<Off>, MR: Module<Reference>>(model: MO, reference: MR) -> (MO, MR) {
    let mut values = ReadParams(Vec::new());
    model.visit(&mut values);
    let reference = reference.map(&mut WriteParams(values.0.into_iter()));
    (model, reference)
}

fn llama_pair(layers: usize) -> (Llama<Off>, Llama<Reference>) {
    let (config, device) = (llama(layers), Default::default());
    pair(config.init(&device), config.init(&device))
}

fn gpt2_pair(layers: usize) -> (Gpt2<Off>, Gpt2<Reference>) {
    let (config, device) = (gpt2(layers), Default::default());
    pair(config.init(&device), config.init(&device))
}

/// Inputs and targets `[2, 16]` of step `step`, on backend `B`.
fn tokens<B: Backend>(vocab: usize, step: u64) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let t = random_tokens::<B>(2, 17, vocab, step, &Default::default());
    (t.clone().narrow(1, 0, 16), t.narrow(1, 1, 16))
}

fn loss<B: BlockRecompute, M: BlockModel<B>>(model: &M, step: u64) -> Tensor<B, 1> {
    let (x, y) = tokens::<B>(model.vocab_size(), step);
    cross_entropy(model.forward(x), y)
}

/// Every float parameter's gradient in visit order, and whether `is_host`
/// says it is in host memory.
struct Gradients<'a, AB: AutodiffBackend> {
    grads: &'a AB::Gradients,
    is_host: fn(TensorPrimitive<AB::InnerBackend>) -> bool,
    out: Vec<(Vec<f32>, bool)>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Gradients<'_, AB> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let grad = param
            .val()
            .grad(self.grads)
            .expect("every parameter has a gradient");
        let host = (self.is_host)(grad.clone().into_primitive());
        self.out
            .push((grad.into_data().to_vec::<f32>().unwrap(), host));
    }
}

fn gradients<AB: AutodiffBackend, M: Module<AB>>(
    model: &M,
    grads: &AB::Gradients,
    is_host: fn(TensorPrimitive<AB::InnerBackend>) -> bool,
) -> Vec<(Vec<f32>, bool)> {
    let mut g = Gradients::<AB> {
        grads,
        is_host,
        out: Vec::new(),
    };
    model.visit(&mut g);
    g.out
}

fn offload_host(t: TensorPrimitive<<Off as AutodiffBackend>::InnerBackend>) -> bool {
    matches!(t, TensorPrimitive::Float(t) if t.is_host())
}

fn never(_: TensorPrimitive<TestBackend>) -> bool {
    false
}

/// One batch's loss and gradients on `Offload` (blocks recomputed) against
/// plain burn on the whole graph: equal within [`TOL`]; every block's eight
/// or more parameter gradients left in host memory; one recompute a block.
fn check_gradients<MO, MR>(model: MO, reference: MR)
where
    MO: BlockModel<Off> + AutodiffModule<Off>,
    MR: BlockModel<Reference> + AutodiffModule<Reference>,
{
    let block_params = {
        let mut n = ReadParams(Vec::new());
        model.blocks()[0].visit(&mut n);
        n.0.len()
    };
    let before = recomputed_blocks();
    let got = loss(&model, 0);
    let want = loss(&reference, 0);
    let (got_value, want_value): (f32, f32) = (
        got.clone().into_scalar().elem(),
        want.clone().into_scalar().elem(),
    );
    assert!(
        ((got_value - want_value) / want_value).abs() <= TOL,
        "loss {got_value} vs {want_value}"
    );
    let got = gradients(&model, &got.backward(), offload_host);
    let want = gradients(&reference, &want.backward(), never);
    assert_eq!(
        recomputed_blocks() - before,
        DEPTH as u64,
        "one recompute a block"
    );
    assert_eq!(got.len(), want.len());
    for (i, ((g, _), (w, _))) in got.iter().zip(&want).enumerate() {
        let err = rel_err(g, w);
        assert!(err <= TOL, "parameter {i}: gradient relative error {err}");
    }
    let host = got.iter().filter(|(_, host)| *host).count();
    assert!(
        host >= DEPTH * block_params,
        "{host} parameter gradients in host memory, want every block's ({} a block)",
        block_params
    );
}

#[test]
fn llama_gradients_with_blocks_recomputed_equal_plain_burn() {
    let _turn = serial();
    let (model, reference) = llama_pair(DEPTH);
    check_gradients(model, reference);
}

#[test]
fn gpt2_gradients_with_blocks_recomputed_equal_plain_burn() {
    let _turn = serial();
    let (model, reference) = gpt2_pair(DEPTH);
    check_gradients(model, reference);
}

/// A module straight from burn's initializers (its parameters lazy until
/// first read), checkpointed before anything read them: the forward, its
/// recompute and the caller's module see the same weights, and the
/// gradient reaches the caller's parameter.
#[test]
fn a_lazily_initialised_module_recomputes_its_own_weights() {
    let _turn = serial();
    lazy_module_on::<Off>();
    lazy_module_on::<Reference>();
}

fn lazy_module_on<AB: AutodiffBackend + BlockRecompute>() {
    let device = Default::default();
    let linear = burn::nn::LinearConfig::new(8, 8).init::<AB>(&device);
    let x = Tensor::<AB, 2>::ones([3, 8], &device).require_grad();
    let checkpointed = recompute(&linear, x.clone(), |l, x| l.forward(x)).sum();
    let got: f32 = checkpointed.clone().into_scalar().elem();
    let grads = checkpointed.backward();
    let gradient = linear
        .weight
        .val()
        .grad(&grads)
        .expect("the caller's weight has its gradient");
    let plain = linear.forward(x).sum();
    let want: f32 = plain.clone().into_scalar().elem();
    assert!(
        ((got - want) / want).abs() <= TOL,
        "checkpointed {got} against {want} from the module's own weights"
    );
    let want_gradient = linear.weight.val().grad(&plain.backward()).unwrap();
    let err = rel_err(
        &gradient
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap(),
        &want_gradient
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap(),
    );
    assert!(err <= TOL, "weight gradient relative error {err}");
}

/// Twenty AdamW steps, the same optimizer on both sides (burn-optim's, on
/// `Offload` wrapped in `HostParams`): losses equal at every step and
/// parameters at the end (`train_side_by_side`).
fn check_twenty_steps<MO, MR>(model: MO, reference: MR)
where
    MO: BlockModel<Off> + AutodiffModule<Off>,
    MR: BlockModel<Reference> + AutodiffModule<Reference>,
{
    let optim = HostParams(AdamWConfig::new().with_weight_decay(0.01).init::<Off, MO>());
    let ref_optim = AdamWConfig::new()
        .with_weight_decay(0.01)
        .init::<Reference, MR>();
    train_side_by_side(model, reference, optim, ref_optim, 20, 3e-3, |_, _| {});
}

#[test]
fn llama_trains_twenty_steps_like_plain_burn() {
    let _turn = serial();
    let (model, reference) = llama_pair(DEPTH);
    check_twenty_steps(model, reference);
}

#[test]
fn gpt2_trains_twenty_steps_like_plain_burn() {
    let _turn = serial();
    let (model, reference) = gpt2_pair(DEPTH);
    check_twenty_steps(model, reference);
}

/// The host AdamW (which updates each parameter in place, in host memory)
/// through recomputed blocks: it follows burn's AdamW on the whole graph
/// (`train_side_by_side`: losses and final parameters), and from the second
/// step on the page-ins of
/// every step, the recomputes' included, replay the trace of the step
/// before.
#[test]
fn the_host_optimizer_trains_through_recomputes_and_replays_the_trace() {
    let _turn = serial();
    let (model, reference) = llama_pair(DEPTH);
    let optim =
        HostOptimizerConfig::adamw(burn_offload::AdamWConfig::default()).init::<Off, Llama<Off>>();
    let ref_optim = AdamWConfig::new().init::<Reference, Llama<Reference>>();
    let replayed = prefetch::stats().replayed;
    train_side_by_side(model, reference, optim, ref_optim, 6, 3e-3, |_, _| {});
    let replays = prefetch::stats().replayed - replayed;
    assert!(
        replays >= 4,
        "{replays} of 6 steps replayed the page-in trace: {:?}",
        prefetch::stats()
    );
}

/// The most device bytes (page cache and live results) of one training step
/// of a Llama `layers` deep on `Offload`, its blocks run by `forward`.
fn step_peak(
    layers: usize,
    forward: impl Fn(&Llama<Off>, Tensor<Off, 2, Int>) -> Tensor<Off, 3>,
) -> u64 {
    let device = Default::default();
    let config = LlamaConfig {
        max_seq_len: 512,
        ..llama(layers)
    };
    let model = config.init::<Off>(&device);
    let block_bytes = (model.blocks()[0].num_params() * 4) as u64;
    set_param_cache_bytes(2 * block_bytes);
    let mut optim =
        HostOptimizerConfig::adamw(burn_offload::AdamWConfig::default()).init::<Off, Llama<Off>>();
    let t = random_tokens::<Off>(1, 513, config.vocab_size, 7, &device);
    let (x, y) = (t.clone().narrow(1, 0, 512), t.narrow(1, 1, 512));
    reset_peak();
    let loss = cross_entropy(forward(&model, x), y);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let _model = optim.step(1e-3, model, grads);
    residency::stats().peak_device_bytes
}

/// The whole model's graph, each block's `forward` called as is.
fn whole_graph(model: &Llama<Off>, x: Tensor<Off, 2, Int>) -> Tensor<Off, 3> {
    let hidden = model
        .blocks()
        .iter()
        .fold(model.embed(x), |x, block| DecoderBlock::forward(block, x));
    model.head(hidden)
}

#[test]
fn device_peak_does_not_grow_with_depth() {
    let _turn = serial();
    let shallow = step_peak(8, |m, x| m.forward(x));
    let deep = step_peak(32, |m, x| m.forward(x));
    let ratio = deep as f64 / shallow as f64;
    assert!(
        ratio <= 1.1,
        "device peak at 32 layers {deep} B, at 8 layers {shallow} B: {ratio:.2}x"
    );
    // The counter sees the whole graph's activations where blocks are not
    // recomputed: the same models grow with depth.
    let shallow_whole = step_peak(8, whole_graph);
    let deep_whole = step_peak(32, whole_graph);
    assert!(
        deep_whole as f64 >= 2.0 * shallow_whole as f64,
        "the whole graph's peak should grow with depth: {shallow_whole} B at 8, {deep_whole} B at 32"
    );
    assert!(
        deep_whole > 2 * deep,
        "{deep_whole} B whole against {deep} B recomputed"
    );
    println!(
        "device peak, recomputed: {shallow} B at 8 layers, {deep} B at 32; \
         whole graph: {shallow_whole} B, {deep_whole} B"
    );
}

/// `recompute` around each block of a plain `Autodiff<B>` model: the same
/// gradients as without. Runs on its own thread and fails, rather than
/// hangs, if the nested backward deadlocks (burn-autodiff without the
/// vendored fix of tracel-ai/burn#5193).
#[test]
fn explicit_recompute_on_plain_autodiff_equals_no_checkpoint() {
    let _turn = serial();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let device = Default::default();
        let config = llama(4);
        let model = config.init::<Reference>(&device);
        let run = |checkpointed: bool| {
            let (x, y) = tokens::<Reference>(config.vocab_size, 3);
            let hidden = model.blocks().iter().fold(model.embed(x), |x, block| {
                if checkpointed {
                    recompute(block, x, DecoderBlock::forward)
                } else {
                    DecoderBlock::forward(block, x)
                }
            });
            let loss = cross_entropy(model.head(hidden), y);
            gradients(&model, &loss.backward(), never)
        };
        let before = recomputed_blocks();
        let got = run(true);
        let recomputed = recomputed_blocks() - before;
        let want = run(false);
        done.send((got, want, recomputed)).unwrap();
    });
    let (got, want, recomputed) = finished
        .recv_timeout(Duration::from_secs(300))
        .expect("the checkpointed backward did not finish: a nested backward deadlocked");
    assert_eq!(recomputed, 4);
    for (i, ((g, _), (w, _))) in got.iter().zip(&want).enumerate() {
        let err = rel_err(g, w);
        assert!(err <= TOL, "parameter {i}: gradient relative error {err}");
    }
}

#[test]
#[should_panic(expected = "read a tracked tensor other than its input")]
fn a_captured_tracked_tensor_is_refused_at_the_forward() {
    let _turn = serial();
    let device = Default::default();
    let model = llama(2).init::<Reference>(&device);
    let x = Tensor::<Reference, 3>::ones([1, 4, 64], &device);
    let captured = Tensor::<Reference, 3>::ones([1, 4, 64], &device).require_grad();
    let _ = recompute(&model.blocks()[0], x, move |block, x| {
        DecoderBlock::forward(block, x) + captured.clone()
    });
}

/// A function that reads none of its module's trained parameters, behind
/// an untracked input: nothing to differentiate, and the backward says so
/// by giving no gradient rather than failing.
#[test]
fn a_function_reading_no_trained_parameter_has_no_gradient() {
    let _turn = serial();
    let device = Default::default();
    let linear = burn::nn::LinearConfig::new(4, 4).init::<Reference>(&device);
    let x = Tensor::<Reference, 2>::ones([2, 4], &device);
    let y = recompute(&linear, x, |_, x| x * 2.0).sum();
    let grads = y.backward();
    assert!(linear.weight.val().grad(&grads).is_none());
}
