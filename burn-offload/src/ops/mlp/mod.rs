//! The SwiGLU MLP, `(silu(x·Wg) ⊙ (x·Wu))·Wd`, as one autodiff operation
//! over tiles of tokens, for long sequences.
//!
//! Written as three linears and the gate, the MLP leaves autodiff five
//! `[tokens, d_ff]` values a token (the two projections, the gate's two
//! inputs, its output): at 256k tokens of Llama-3.2-1B in bf16, 20 GiB of a
//! block's activations. [`swiglu_mlp`] keeps its input and the weights only.
//! The forward runs tile by tile; the backward recomputes each tile's two
//! projections and the gate, then forms the tile's input gradient and adds
//! its share of the weights' gradients to f32 sums. The price is the two
//! projections again (a third more of the MLP's matmuls); the gain is that
//! the MLP's peak is one tile's, whatever the sequence.

mod base;

pub use base::*;
