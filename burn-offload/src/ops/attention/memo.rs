//! Attention's outputs kept from a block's graph-free forward for its
//! recompute: the engine recomputes each block from its input in the
//! backward, and attention's forward is most of a long sequence's block
//! (at 262k tokens on the H100, 0.57 s of cuDNN's forward a block, run
//! again in every recompute). [`capture`] collects what attention
//! computed while a block ran; [`replay`] hands it back, in call order, to
//! the same block's recompute, whose attention then skips its forward.
//! A captured value whose shape or type does not fit the call that takes
//! it is not used (that call computes its forward).

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// One block's attention outputs and log-sum-exps, in call order.
#[derive(Default)]
pub struct AttentionMemo(VecDeque<Box<dyn Any + Send>>);

impl std::fmt::Debug for AttentionMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttentionMemo({} outputs)", self.0.len())
    }
}

enum Slot {
    Off,
    Capturing(AttentionMemo),
    Replaying(AttentionMemo),
}

thread_local! {
    static SLOT: RefCell<Slot> = const { RefCell::new(Slot::Off) };
}

/// Outputs replayed in this process (a test's handle on whether they are).
static REPLAYED: AtomicU64 = AtomicU64::new(0);

/// How many attention forwards a recompute has skipped in this process.
pub fn replayed_attention_outputs() -> u64 {
    REPLAYED.load(Ordering::Relaxed)
}

/// Puts `slot` in place for the guard's life, and the previous one back
/// after it (also when `f` unwinds).
struct Guard(Option<Slot>);

impl Guard {
    fn set(slot: Slot) -> Self {
        Self(Some(SLOT.with(|s| s.replace(slot))))
    }

    fn finish(mut self) -> Slot {
        let previous = self.0.take().expect("set once");
        SLOT.with(|s| s.replace(previous))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            SLOT.with(|s| s.replace(previous));
        }
    }
}

/// Runs `f` (a block's graph-free forward) and returns what the attention
/// calls in it computed.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, AttentionMemo) {
    let guard = Guard::set(Slot::Capturing(AttentionMemo::default()));
    let result = f();
    match guard.finish() {
        Slot::Capturing(memo) => (result, memo),
        _ => (result, AttentionMemo::default()),
    }
}

/// Runs `f` (the same block's recompute) with `memo` handed, in order, to
/// its attention calls.
pub fn replay<R>(memo: AttentionMemo, f: impl FnOnce() -> R) -> R {
    let guard = Guard::set(Slot::Replaying(memo));
    let result = f();
    drop(guard);
    result
}

/// Keeps an attention call's output and log-sum-exp while capturing.
pub(super) fn keep<B: Backend>(output: &Tensor<B, 4>, lse: &Tensor<B, 4>) {
    SLOT.with(|s| {
        if let Slot::Capturing(memo) = &mut *s.borrow_mut() {
            memo.0.push_back(Box::new((output.clone(), lse.clone())));
        }
    });
}

/// The next kept output and log-sum-exp while replaying, if it has the
/// dims `output` and `lse` the call expects.
pub(super) fn kept<B: Backend>(
    output: [usize; 4],
    lse: [usize; 4],
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    SLOT.with(|s| {
        let Slot::Replaying(memo) = &mut *s.borrow_mut() else {
            return None;
        };
        let next = memo.0.pop_front()?;
        let (o, l) = *next.downcast::<(Tensor<B, 4>, Tensor<B, 4>)>().ok()?;
        (o.dims() == output && l.dims() == lse).then(|| {
            REPLAYED.fetch_add(1, Ordering::Relaxed);
            (o, l)
        })
    })
}
