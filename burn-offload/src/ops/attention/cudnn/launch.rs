//! Running the graphs on burn's CUDA tensors: libcudnn found at run time,
//! one handle per thread and device set to cubecl's stream (as cuBLAS is,
//! `crate::cuda`'s matmul module), plans built once per shape and kept.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape as Dims, Tensor};
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;
use cudarc::cudnn::sys;
use cudarc::driver::sys::CUstream;

use super::backend::{check, CudnnError, Result};
use super::graph::{Graph, Plan};
use super::sdpa::{self, uid, Shape};
use crate::cuda::{as_float, bind_context, device_ptr_and_stream, empty_like, float_cube};

/// Whether [`causal_attention`](crate::ops::causal_attention) may run
/// cuDNN's fused attention where the library takes the tensors.
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Lets (`true`, the default) or keeps (`false`) cuDNN's fused attention
/// from running where it takes the tensors; kept from it, the CubeCL
/// kernels run. For benchmarks that compare the two, and users who want
/// the kernels this crate ships.
pub fn set_cudnn_attention(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Passes cuDNN has run in this process.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// How many attention passes (forward or backward) cuDNN has run in this
/// process: what tells a test or benchmark which implementation ran.
pub fn cudnn_attention_runs() -> u64 {
    RUNS.load(Ordering::Relaxed)
}

/// The version of the cuDNN library attention would run on (`91900` for
/// 9.19.0), or `None` where none can be loaded or it is older than 9.0.
pub fn cudnn_version() -> Option<usize> {
    library().ok()
}

/// The version of the cuDNN library loaded (`91900` for 9.19.0), or why
/// none runs attention.
fn library() -> Result<usize> {
    static VERSION: OnceLock<Option<usize>> = OnceLock::new();
    // SAFETY: loading the library runs its initialisers only.
    let found =
        *VERSION.get_or_init(|| unsafe { sys::is_culib_present().then(|| sys::cudnnGetVersion()) });
    match found {
        None => Err(CudnnError::Missing),
        Some(v) if v < 90000 => Err(CudnnError::TooOld { found: v }),
        Some(v) => Ok(v),
    }
}

/// `91900` as `9.19.0`.
fn dotted(version: usize) -> String {
    format!(
        "{}.{}.{}",
        version / 10000,
        version / 100 % 100,
        version % 100
    )
}

/// Says once per process which implementation attention took, and once
/// per shape where cuDNN refused one.
fn announce(line: String) {
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&line) {
        eprintln!("{line}");
        said.push(line);
    }
}

/// Whether cuDNN may run attention on `q` (a bf16 or f16 CUDA tensor with
/// heads of a width cuDNN's fused attention takes, the library present and
/// not switched off). A missing library is said once.
pub(crate) fn takes<B: Backend>(q: &Tensor<B, 4>) -> bool {
    let [_, _, _, dim] = q.dims();
    if !ENABLED.load(Ordering::Relaxed) || !crate::ops::attention::cudnn_takes(q.dtype(), dim) {
        return false;
    }
    if float_cube(q).is_none() {
        return false;
    }
    match library() {
        Ok(_) => true,
        Err(e) => {
            // Said once, without formatting the line on every call.
            static SAID: Once = Once::new();
            SAID.call_once(|| announce(format!("attention: the CubeCL kernels ({e})")));
            false
        }
    }
}

/// A cuDNN handle of this thread for one device, the stream it was last
/// set to, and the plans built with it (or why a shape has none).
struct Cudnn {
    handle: sys::cudnnHandle_t,
    stream: CUstream,
    /// `None` for a shape cuDNN refused (said when it did).
    plans: HashMap<(bool, Shape), Option<Rc<Plan>>>,
}

thread_local! {
    /// By device index: a handle belongs to the context it was made in.
    static CUDNN: RefCell<Vec<Option<Cudnn>>> = const { RefCell::new(Vec::new()) };
}

/// The plan for `shape` (the backward's with `backward`), built on first
/// use, and this thread's handle set to `stream`, for `run`.
fn with_plan<R>(
    device: &CudaDevice,
    stream: CUstream,
    backward: bool,
    shape: &Shape,
    run: impl FnOnce(sys::cudnnHandle_t, &Plan, usize) -> Result<R>,
) -> Result<R> {
    let version = library()?;
    bind_context(device);
    CUDNN.with(|cell| {
        let mut states = cell.borrow_mut();
        if states.len() <= device.index {
            states.resize_with(device.index + 1, || None);
        }
        let slot = &mut states[device.index];
        if slot.is_none() {
            let mut handle = std::ptr::null_mut();
            // SAFETY: the device's primary context is current.
            check(unsafe { sys::cudnnCreate(&mut handle) }, "cudnnCreate")?;
            *slot = Some(Cudnn {
                handle,
                stream: std::ptr::null_mut(),
                plans: HashMap::new(),
            });
        }
        let state = slot.as_mut().expect("just set");
        if state.stream != stream {
            // SAFETY: a live handle and a live stream of this context.
            check(
                unsafe { sys::cudnnSetStream(state.handle, stream.cast()) },
                "cudnnSetStream",
            )?;
            state.stream = stream;
        }
        let key = (backward, shape.clone());
        let handle = state.handle;
        let plan = state.plans.entry(key).or_insert_with(|| {
            let mut graph = Graph::new(uid::FIRST_INNER);
            let built = if backward {
                sdpa::backward(&mut graph, shape)
            } else {
                sdpa::forward(&mut graph, shape)
            };
            let plan = built.and_then(|()| graph.plan(handle));
            match plan {
                Ok(plan) => {
                    announce(format!("attention: cuDNN {} fused attention", dotted(version)));
                    Some(Rc::new(plan))
                }
                Err(e) => {
                    let pass = if backward { "backward" } else { "forward" };
                    announce(format!(
                        "attention: cuDNN {} refused the {pass} of {} heads of {} ({} key/value heads) over {} positions ({e}); the CubeCL kernels run it",
                        dotted(version),
                        shape.heads,
                        shape.dim,
                        shape.kv_heads,
                        shape.seq
                    ));
                    None
                }
            }
        });
        let plan = plan.clone().ok_or(CudnnError::Refused)?;
        drop(states);
        run(handle, &plan, version)
    })
}

/// Device addresses of `tensors`, all on `stream` (cubecl's stream of this
/// thread, ordered behind their writers), each 16-byte aligned as the
/// graph declares.
fn addresses<'a>(
    tensors: impl IntoIterator<Item = &'a CubeTensor<CudaRuntime>>,
) -> Result<(Vec<*mut c_void>, CUstream)> {
    let mut out = Vec::new();
    let mut stream = None;
    for t in tensors {
        let (ptr, s) = device_ptr_and_stream(t);
        if ptr % 16 != 0 {
            return Err(CudnnError::Layout("a tensor not aligned to 16 bytes"));
        }
        if s.is_null() || stream.is_some_and(|first| first != s) {
            return Err(CudnnError::Layout("tensors on different streams"));
        }
        stream = Some(s);
        out.push(ptr as *mut c_void);
    }
    Ok((out, stream.unwrap_or(std::ptr::null_mut())))
}

/// Strides of `t` when its rows are contiguous (unit stride along the last
/// dimension, as cuDNN's attention reads them).
fn strides(t: &CubeTensor<CudaRuntime>) -> Option<[i64; 4]> {
    let s = t.meta.strides();
    let s: [usize; 4] = s.to_vec().try_into().ok()?;
    (s[3] == 1).then(|| s.map(|x| x as i64))
}

fn dims(t: &CubeTensor<CudaRuntime>) -> Option<[usize; 4]> {
    t.meta.shape().to_vec().try_into().ok()
}

fn io_type(dtype: DType) -> Option<sys::cudnnDataType_t> {
    match dtype {
        DType::BF16 => Some(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::F16 => Some(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        _ => None,
    }
}

/// Values of the scalars the graphs take by value.
struct Scalars {
    scale: f32,
    neg_inf: f32,
    one: f32,
    window: f32,
}

impl Scalars {
    fn new(shape: &Shape, version: usize) -> Self {
        Self {
            scale: 1.0 / (shape.dim as f32).sqrt(),
            // Before 9.10 cuDNN's masks wanted the lowest float, not −∞
            // (cudnn-frontend's `get_negative_inf_value`).
            neg_inf: if version < 91000 {
                f32::MIN
            } else {
                f32::NEG_INFINITY
            },
            one: 1.0,
            window: shape.window.map_or(0.0, |w| w as f32),
        }
    }

    /// The ids and host addresses of the scalars a pass binds.
    fn bindings(&mut self, backward: bool, window: bool) -> Vec<(i64, *mut c_void)> {
        let mut out = vec![
            (uid::SCALE, (&mut self.scale as *mut f32).cast()),
            (uid::NEG_INF, (&mut self.neg_inf as *mut f32).cast()),
        ];
        if backward {
            out.push((uid::ONE, (&mut self.one as *mut f32).cast()));
        }
        if window {
            out.push((uid::WINDOW, (&mut self.window as *mut f32).cast()));
            out.push((uid::WINDOW_NEG_INF, (&mut self.neg_inf as *mut f32).cast()));
        }
        out
    }
}

/// The plan's key for `q: [b, h, s, d]` over `k: [b, kv, s, d]` in `io`,
/// with the strides of the bound inputs; `None` where a row is not
/// contiguous. A window as long as the sequence hides nothing the causal
/// mask does not (`attention_by` drops it before a pass runs).
fn shape_of(
    q: &CubeTensor<CudaRuntime>,
    k: &CubeTensor<CudaRuntime>,
    io: sys::cudnnDataType_t,
    window: Option<usize>,
    inputs: &[&CubeTensor<CudaRuntime>],
) -> Option<Shape> {
    let [batch, heads, seq, dim] = dims(q)?;
    Some(Shape {
        batch: batch as i64,
        heads: heads as i64,
        kv_heads: dims(k)?[1] as i64,
        seq: seq as i64,
        dim: dim as i64,
        io,
        window: window.map(|w| w as i64),
        strides: inputs.iter().map(|t| strides(t)).collect::<Option<_>>()?,
    })
}

/// Runs the forward's (or with `backward`, the backward's) plan for
/// `shape` with each `(uid, tensor)` of `bound` and the pass's scalars, on
/// the tensors' stream, with a fresh workspace.
fn run_pass(
    backward: bool,
    shape: &Shape,
    bound: &[(i64, &CubeTensor<CudaRuntime>)],
) -> Result<()> {
    let like = bound[0].1;
    let (pointers, stream) = addresses(bound.iter().map(|(_, t)| *t))?;
    with_plan(
        &like.device,
        stream,
        backward,
        shape,
        |handle, plan, version| {
            let workspace =
                (plan.workspace > 0).then(|| empty_like(like, &[plan.workspace], DType::U8));
            let workspace_ptr = match &workspace {
                Some(w) => addresses([w])?.0[0],
                None => std::ptr::null_mut(),
            };
            let mut scalars = Scalars::new(shape, version);
            let (mut uids, mut pointers): (Vec<i64>, Vec<*mut c_void>) =
                bound.iter().map(|(uid, _)| *uid).zip(pointers).unzip();
            for (uid, pointer) in scalars.bindings(backward, shape.window.is_some()) {
                uids.push(uid);
                pointers.push(pointer);
            }
            // SAFETY: every bound address is a live buffer of the layout the
            // graph declares, or a scalar on this stack frame (cuDNN reads
            // scalars while queueing); buffers are freed by cubecl in this
            // stream's order, after the plan has run.
            unsafe { plan.execute(handle, &uids, &pointers, workspace_ptr) }?;
            RUNS.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    )
}

/// The output `[b, h, s, d]` and each row's log-sum-exp (f32 `[b, h, s,
/// 1]`) of causal attention (within `window` where there is one), as
/// [`super::super::flash`]'s forward; `None` where cuDNN does not run it.
pub(crate) fn forward<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    window: Option<usize>,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let (q, k, v) = (float_cube(q)?, float_cube(k)?, float_cube(v)?);
    let io = io_type(q.dtype).filter(|_| k.dtype == q.dtype && v.dtype == q.dtype)?;
    let shape = shape_of(&q, &k, io, window, &[&q, &k, &v])?;
    let [batch, heads, seq, dim] = dims(&q)?;
    let out = empty_like(&q, &[batch, heads, seq, dim], q.dtype);
    let stats = empty_like(&q, &[batch, heads, seq, 1], DType::F32);
    if batch * heads * seq > 0 {
        let bound = [
            (uid::Q, &q),
            (uid::K, &k),
            (uid::V, &v),
            (uid::O, &out),
            (uid::STATS, &stats),
        ];
        run_pass(false, &shape, &bound).ok()?;
    }
    Some((as_float(out), as_float(stats)))
}

/// `[dq, dk, dv]` of [`forward`] for the output gradient `grad`, from its
/// inputs `q, k, v`, output `o` (each `[b, h|kv, s, d]`) and log-sum-exp
/// (f32 `[b, h, s, 1]`); `None` where cuDNN does not run it.
pub(crate) fn backward<B: Backend>(
    [q, k, v, o, grad]: [&Tensor<B, 4>; 5],
    lse: &Tensor<B, 4>,
    window: Option<usize>,
) -> Option<[Tensor<B, 4>; 3]> {
    let [q, k, v, o, grad, lse] = [q, k, v, o, grad, lse].map(float_cube);
    let (q, k, v, o, grad, lse) = (q?, k?, v?, o?, grad?, lse?);
    let io = io_type(q.dtype)?;
    if [&k, &v, &o, &grad].iter().any(|t| t.dtype != q.dtype) || lse.dtype != DType::F32 {
        return None;
    }
    let shape = shape_of(&q, &k, io, window, &[&q, &k, &v, &o, &grad, &lse])?;
    let [batch, heads, seq, dim] = dims(&q)?;
    let kv_heads = dims(&k)?[1];
    let dq = empty_like(&q, &[batch, heads, seq, dim], q.dtype);
    let dk = empty_like(&q, &[batch, kv_heads, seq, dim], q.dtype);
    let dv = empty_like(&q, &[batch, kv_heads, seq, dim], q.dtype);
    if batch * heads * seq > 0 {
        let row_dot = empty_like(&q, &[batch, heads, seq, 1], DType::F32);
        // The query gradient's sums start from zero (cuDNN before 9.6 did
        // not clear them itself).
        let dq_sum = zeros_client(
            q.client.clone(),
            q.device.clone(),
            Dims::new([batch, heads, seq, dim]),
            DType::F32,
        );
        let bound = [
            (uid::Q, &q),
            (uid::K, &k),
            (uid::V, &v),
            (uid::O, &o),
            (uid::DO, &grad),
            (uid::STATS, &lse),
            (uid::DQ, &dq),
            (uid::DK, &dk),
            (uid::DV, &dv),
            (uid::ROW_DOT, &row_dot),
            (uid::DQ_SUM, &dq_sum),
        ];
        run_pass(true, &shape, &bound).ok()?;
    }
    Some([as_float(dq), as_float(dk), as_float(dv)])
}
