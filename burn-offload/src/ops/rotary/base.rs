use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::ops::record::{backward_each, cast, record, same, with_custom_backward};
use crate::precision::cast_to;

/// Rotates `x [batch, heads, seq, head_dim]` by the tables `cos` and `sin`
/// (`[seq, head_dim]`, any float dtype; position `t` on row `t`), in `x`'s
/// dtype.
///
/// # Panics
/// If the tables are not `[seq, head_dim]` or `head_dim` is odd.
pub fn rotate_half<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 2>,
    sin: &Tensor<B, 2>,
) -> Tensor<B, 4> {
    let [_, _, seq, head_dim] = x.dims();
    assert!(
        cos.dims() == [seq, head_dim] && sin.dims() == [seq, head_dim],
        "rotary: tables {:?} and {:?} for x {:?}",
        cos.dims(),
        sin.dims(),
        x.dims()
    );
    assert!(head_dim % 2 == 0, "rotary: head_dim {head_dim} is odd");
    rotated(x, cos.clone().unsqueeze(), sin.clone().unsqueeze())
}

/// [`rotate_half`] with tables of each row's own positions, `[batch, seq,
/// head_dim]`: row `b`, position `t` is rotated by `cos[b, t]` and
/// `sin[b, t]` (packed windows, whose positions restart at each document).
///
/// # Panics
/// If the tables are not `[batch, seq, head_dim]` or `head_dim` is odd.
pub fn rotate_half_rows<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 3>,
    sin: &Tensor<B, 3>,
) -> Tensor<B, 4> {
    let [batch, _, seq, head_dim] = x.dims();
    assert!(
        cos.dims() == [batch, seq, head_dim] && sin.dims() == [batch, seq, head_dim],
        "rotary: tables {:?} and {:?} for x {:?}",
        cos.dims(),
        sin.dims(),
        x.dims()
    );
    assert!(head_dim % 2 == 0, "rotary: head_dim {head_dim} is odd");
    rotated(x, cos.clone(), sin.clone())
}

/// The rotation by tables `[rows, seq, head_dim]` (one row for every
/// sequence, or one per sequence): one operation on the autodiff backends
/// with a backward of their own.
fn rotated<B: Backend>(x: Tensor<B, 4>, cos: Tensor<B, 3>, sin: Tensor<B, 3>) -> Tensor<B, 4> {
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner>(
                    cast(x),
                    cast::<_, Tensor<Autodiff<$inner>, 3>>(cos).inner(),
                    cast::<_, Tensor<Autodiff<$inner>, 3>>(sin).inner(),
                ));
            }
        };
    }
    with_custom_backward!(tracked_on);
    rotate(x, cos, sin, false)
}

/// `x·cos + rotate_half(x)·sin`, or its transpose applied to `x` where
/// `transpose`: `x·cos + rotate_half^T(x·sin)`, for tables `[rows, seq,
/// head_dim]` (`rows` 1 or `x`'s batch), broadcast over the heads.
fn rotate<B: Backend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
    transpose: bool,
) -> Tensor<B, 4> {
    // The kernel reads one table for every sequence; per-row tables run
    // in tensor ops.
    #[cfg(feature = "cuda")]
    if cos.dims()[0] == 1 {
        let table = |t: &Tensor<B, 3>| t.clone().squeeze_dim::<2>(0);
        if let Some(out) = super::cuda::rotate(&x, &table(&cos), &table(&sin), transpose) {
            return out;
        }
    }
    let dtype = x.dtype();
    let (cos, sin) = (
        cast_to(cos, dtype).unsqueeze_dim::<4>(1),
        cast_to(sin, dtype).unsqueeze_dim::<4>(1),
    );
    let half = x.dims()[3] / 2;
    let halves = |t: &Tensor<B, 4>| {
        (
            t.clone().narrow(3, 0, half),
            t.clone().narrow(3, half, half),
        )
    };
    if transpose {
        let (p, q) = halves(&(x.clone() * sin));
        x * cos + Tensor::cat(vec![q, p.neg()], 3)
    } else {
        let (a, c) = halves(&x);
        x * cos + Tensor::cat(vec![c.neg(), a], 3) * sin
    }
}

#[derive(Debug)]
struct Rotary;

impl<B: Backend> Backward<B, 1> for Rotary {
    /// The tables `cos` and `sin`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_each::<B, _, 1>(ops, grads, |(cos, sin), grad| {
            let table = |t| Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(t));
            let grad = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(grad));
            [rotate(grad, table(cos), table(sin), true)
                .into_primitive()
                .tensor()]
        });
    }
}

/// [`rotate_half`] on `Autodiff<B>` as one operation (the tables untracked).
fn tracked<B: Backend>(
    x: Tensor<Autodiff<B>, 4>,
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
) -> Tensor<Autodiff<B>, 4> {
    let x = x.into_primitive().tensor();
    let inner = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(x.primitive.clone()));
    let y = rotate(inner, cos.clone(), sin.clone(), false)
        .into_primitive()
        .tensor();
    let out = record(Rotary, [x], y, |_| {
        (cos.into_primitive().tensor(), sin.into_primitive().tensor())
    });
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, Distribution};

    type A = Autodiff<Flex>;

    /// The tensor-op formulation autodiff differentiates op by op.
    fn reference(x: Tensor<A, 4>, cos: &Tensor<A, 2>, sin: &Tensor<A, 2>) -> Tensor<A, 4> {
        let half = x.dims()[3] / 2;
        let first = x.clone().narrow(3, 0, half);
        let second = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        x * cos.clone().unsqueeze::<4>() + rotated * sin.clone().unsqueeze::<4>()
    }

    #[test]
    fn fused_rotary_matches_the_tensor_ops_and_their_gradient() {
        let device = Default::default();
        let random =
            |dims: [usize; 4]| Tensor::<A, 4>::random(dims, Distribution::Default, &device);
        // A swapped view, as the attention's heads are.
        let x = random([2, 5, 3, 8]).swap_dims(1, 2);
        let upstream = random([2, 3, 5, 8]).detach();
        let angles = Tensor::<A, 2>::random([5, 8], Distribution::Uniform(-3.0, 3.0), &device);
        let (cos, sin) = (angles.clone().cos(), angles.sin());
        let run = |fused: bool| {
            let x = x.clone().require_grad();
            let out = if fused {
                rotate_half(x.clone(), &cos, &sin)
            } else {
                reference(x.clone(), &cos, &sin)
            };
            let grads = (out.clone() * upstream.clone()).sum().backward();
            [out.inner(), x.grad(&grads).expect("used")]
        };
        for (name, (a, b)) in ["out", "dx"]
            .iter()
            .zip(run(true).into_iter().zip(run(false)))
        {
            assert_eq!(a.dtype(), DType::F32);
            let err: f32 = (a - b).abs().max().into_scalar();
            assert!(err < 1e-5, "{name} off by {err}");
        }
    }
    /// Tables per row rotate each row as its own `[seq, head_dim]` tables
    /// do, values and gradient: rows at different positions (a packed row
    /// restarts them) stay apart.
    #[test]
    fn per_row_tables_rotate_each_row_by_its_own() {
        let device = Default::default();
        let random =
            |dims: [usize; 4]| Tensor::<A, 4>::random(dims, Distribution::Default, &device);
        let x = random([3, 2, 5, 8]).require_grad();
        let upstream = random([3, 2, 5, 8]).detach();
        let angles = Tensor::<A, 3>::random([3, 5, 8], Distribution::Uniform(-3.0, 3.0), &device);
        let (cos, sin) = (angles.clone().cos(), angles.sin());
        let packed = rotate_half_rows(x.clone(), &cos, &sin);
        let grads = (packed.clone() * upstream.clone()).sum().backward();
        let dx = x.grad(&grads).expect("used");
        for b in 0..3 {
            let row = |t: &Tensor<A, 3>| t.clone().narrow(0, b, 1).squeeze_dim::<2>(0);
            let xb = x.clone().inner().narrow(0, b, 1);
            let xb = Tensor::<A, 4>::from_inner(xb).require_grad();
            let alone = reference(xb.clone(), &row(&cos), &row(&sin));
            let up = upstream.clone().narrow(0, b, 1);
            let grads = (alone.clone() * up).sum().backward();
            let want = [alone.inner(), xb.grad(&grads).expect("used")];
            let got = [
                packed.clone().inner().narrow(0, b, 1),
                dx.clone().narrow(0, b, 1),
            ];
            for (name, (a, w)) in ["out", "dx"].iter().zip(got.into_iter().zip(want)) {
                let err: f32 = (a - w).abs().max().into_scalar();
                assert!(err < 1e-5, "row {b}: {name} off by {err}");
            }
        }
    }
}
