use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use crate::ops::record::{backward_each, cast, record, same, tensor, with_custom_backward};
use crate::ops::swiglu::{swiglu, swiglu_backward};
use crate::precision::cast_to;

/// Tokens per tile where a plan tiles the MLP: at Llama-3.1-8B's width
/// (`d_ff` 14336) a tile's six `[tile, d_ff]` values in bf16 are 1.3 GiB,
/// and its matmuls still fill an H100.
pub const MLP_TILE_TOKENS: usize = 8192;

/// `(silu(x·gate) ⊙ (x·up))·down` for `x: [tokens, d]`, `gate` and `up`
/// `[d, ff]` and `down` `[ff, d]` (burn's `Linear` layout), `tile` tokens at
/// a time (see the module docs). Backends without the operation get the
/// plain formulation.
///
/// # Panics
/// If the shapes do not chain, or `tile` is 0.
pub fn swiglu_mlp<B: Backend>(
    x: Tensor<B, 2>,
    gate: Tensor<B, 2>,
    up: Tensor<B, 2>,
    down: Tensor<B, 2>,
    tile: usize,
) -> Tensor<B, 2> {
    let ([_, d], [gd, ff]) = (x.dims(), gate.dims());
    assert!(
        gd == d && up.dims() == [d, ff] && down.dims() == [ff, d],
        "swiglu_mlp: x {:?}, gate {:?}, up {:?}, down {:?} do not chain",
        x.dims(),
        gate.dims(),
        up.dims(),
        down.dims()
    );
    assert!(tile > 0, "swiglu_mlp: tiles of 0 tokens");
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner>(
                    [cast(x), cast(gate), cast(up), cast(down)],
                    tile,
                ));
            }
        };
    }
    with_custom_backward!(tracked_on);
    if B::ad_enabled(&x.device()) {
        one_tile(x, &gate, &up, &down)
    } else {
        forward(x, &gate, &up, &down, tile)
    }
}

/// The MLP over one tile of tokens.
fn one_tile<B: Backend>(
    x: Tensor<B, 2>,
    gate: &Tensor<B, 2>,
    up: &Tensor<B, 2>,
    down: &Tensor<B, 2>,
) -> Tensor<B, 2> {
    swiglu(x.clone().matmul(gate.clone()), x.matmul(up.clone())).matmul(down.clone())
}

/// The tiles of `tokens`: `(start, len)`.
fn tiles(tokens: usize, tile: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..tokens)
        .step_by(tile)
        .map(move |start| (start, tile.min(tokens - start)))
}

fn forward<B: Backend>(
    x: Tensor<B, 2>,
    gate: &Tensor<B, 2>,
    up: &Tensor<B, 2>,
    down: &Tensor<B, 2>,
    tile: usize,
) -> Tensor<B, 2> {
    let tokens = x.dims()[0];
    if tile >= tokens {
        return one_tile(x, gate, up, down);
    }
    let parts = tiles(tokens, tile)
        .map(|(start, len)| one_tile(x.clone().narrow(0, start, len), gate, up, down))
        .collect();
    Tensor::cat(parts, 0)
}

/// `[dx, d gate, d up, d down]` for the output gradient `grad`, tile by
/// tile; the weights' gradients are summed in f32 and returned in their
/// dtype.
fn backward<B: Backend>(
    [x, gate, up, down]: [Tensor<B, 2>; 4],
    grad: Tensor<B, 2>,
    tile: usize,
) -> [Tensor<B, 2>; 4] {
    let tokens = x.dims()[0];
    let sum = |total: Option<Tensor<B, 2>>, part: Tensor<B, 2>| {
        let part = cast_to(part, DType::F32);
        Some(match total {
            None => part,
            Some(total) => total + part,
        })
    };
    let (mut dgate, mut dup, mut ddown) = (None, None, None);
    let mut dxs = Vec::new();
    for (start, len) in tiles(tokens, tile) {
        let x = x.clone().narrow(0, start, len);
        let grad = grad.clone().narrow(0, start, len);
        let (g, u) = (x.clone().matmul(gate.clone()), x.clone().matmul(up.clone()));
        let gated = swiglu(g.clone(), u.clone());
        ddown = sum(ddown, gated.transpose().matmul(grad.clone()));
        let dgated = grad.matmul(down.clone().transpose());
        let (dg, du) = swiglu_backward(g, u, dgated);
        let xt = x.transpose();
        dgate = sum(dgate, xt.clone().matmul(dg.clone()));
        dup = sum(dup, xt.matmul(du.clone()));
        dxs.push(dg.matmul(gate.clone().transpose()) + du.matmul(up.clone().transpose()));
    }
    let dx = match dxs.len() {
        1 => dxs.pop().expect("one tile"),
        _ => Tensor::cat(dxs, 0),
    };
    let weight = |total: Option<Tensor<B, 2>>, like: &Tensor<B, 2>| {
        cast_to(total.expect("at least one tile"), like.dtype())
    };
    [
        dx,
        weight(dgate, &gate),
        weight(dup, &up),
        weight(ddown, &down),
    ]
}

#[derive(Debug)]
struct SwiGluMlp {
    tile: usize,
}

impl<B: Backend> Backward<B, 4> for SwiGluMlp {
    /// `x` and the three weights.
    type State = [FloatTensor<B>; 4];

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_each::<B, _, 4>(ops, grads, |state, grad| {
            backward(state.map(tensor::<B, 2>), tensor(grad), self.tile)
                .map(|g| g.into_primitive().tensor())
        });
    }
}

/// [`swiglu_mlp`] on `Autodiff<B>` as one operation.
fn tracked<B: Backend>(inputs: [Tensor<Autodiff<B>, 2>; 4], tile: usize) -> Tensor<Autodiff<B>, 2> {
    let inputs = inputs.map(|t| t.into_primitive().tensor());
    let [x, gate, up, down] = inputs
        .each_ref()
        .map(|t| tensor::<B, 2>(t.primitive.clone()));
    let result = forward(x, &gate, &up, &down, tile)
        .into_primitive()
        .tensor();
    let out = record(SwiGluMlp { tile }, inputs, result, |state| state);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::silu;
    use burn::tensor::Distribution;

    type A = Autodiff<Flex>;

    /// Values and the gradients of the input and the three weights against
    /// burn differentiating the plain formulation, for tiles that do and do
    /// not divide the tokens, and one tile of all of them.
    #[test]
    fn tiled_mlp_matches_the_plain_formulation() {
        let device = Default::default();
        let (tokens, d, ff) = (11, 6, 10);
        let random = |shape: [usize; 2]| {
            Tensor::<A, 2>::random(shape, Distribution::Normal(0.0, 1.0), &device)
        };
        let (x, gate, up, down) = (
            random([tokens, d]),
            random([d, ff]),
            random([d, ff]),
            random([ff, d]),
        );
        let upstream = random([tokens, d]).detach();
        let run = |tile: Option<usize>| {
            let [x, gate, up, down] =
                [&x, &gate, &up, &down].map(|t| t.clone().detach().require_grad());
            let out = match tile {
                Some(tile) => swiglu_mlp(x.clone(), gate.clone(), up.clone(), down.clone(), tile),
                None => (silu(x.clone().matmul(gate.clone())) * x.clone().matmul(up.clone()))
                    .matmul(down.clone()),
            };
            let grads = (out.clone() * upstream.clone()).sum().backward();
            let grad = |t: &Tensor<A, 2>| t.grad(&grads).expect("used");
            [out.inner(), grad(&x), grad(&gate), grad(&up), grad(&down)]
        };
        let want = run(None);
        for tile in [1, 3, 4, 11, 64] {
            for (name, (a, b)) in ["out", "dx", "dgate", "dup", "ddown"]
                .iter()
                .zip(run(Some(tile)).into_iter().zip(want.clone()))
            {
                assert_eq!(a.dims(), b.dims());
                let scale: f32 = b.clone().abs().max().into_scalar();
                let err: f32 = (a - b).abs().max().into_scalar();
                assert!(
                    err < 1e-5 * scale.max(1.0),
                    "tiles of {tile}: {name} off by {err}"
                );
            }
        }
    }
}
