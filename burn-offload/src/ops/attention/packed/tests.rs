//! Packed attention against each document run alone through burn's own
//! attention, on the same leaves: values and `q`, `k`, `v` gradients.

use super::*;
use crate::ops::attention::has_custom_backward;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::Distribution;

type AD = Autodiff<Flex>;

fn random(shape: [usize; 4], std: f64) -> Tensor<AD, 4> {
    Tensor::random(shape, Distribution::Normal(0.0, std), &Default::default()).require_grad()
}

/// burn's causal attention (with keys `window` or more back masked) on one
/// sequence, keys and values repeated per query head.
fn burns(
    q: Tensor<AD, 4>,
    k: Tensor<AD, 4>,
    v: Tensor<AD, 4>,
    window: Option<usize>,
) -> Tensor<AD, 4> {
    let [batch, heads, seq, _] = q.dims();
    let repeat = |x: Tensor<AD, 4>| {
        let [b, kv, s, d] = x.dims();
        x.unsqueeze_dim::<5>(2)
            .expand([b, kv, heads / kv, s, d])
            .reshape([b, heads, s, d])
    };
    let mask = window.map(|window| {
        let past: Vec<bool> = (0..seq)
            .flat_map(|i| (0..seq).map(move |j| j + window <= i))
            .collect();
        Tensor::<AD, 2, Bool>::from_data(TensorData::new(past, [seq, seq]), &q.device())
            .unsqueeze::<4>()
            .expand([batch, heads, seq, seq])
    });
    let options = AttentionModuleOptions {
        is_causal: true,
        ..Default::default()
    };
    attention(q, repeat(k), repeat(v), mask, None, options)
}

/// Each document of each row run alone, the outputs laid back in place.
fn alone(
    q: Tensor<AD, 4>,
    k: Tensor<AD, 4>,
    v: Tensor<AD, 4>,
    window: Option<usize>,
    documents: &Documents,
) -> Tensor<AD, 4> {
    let seq = documents.seq();
    let rows = (0..documents.batch())
        .map(|b| {
            let starts = documents.starts(b);
            let parts = starts
                .iter()
                .enumerate()
                .map(|(i, &start)| {
                    let len = starts.get(i + 1).copied().unwrap_or(seq) - start;
                    let cut = |x: &Tensor<AD, 4>| x.clone().narrow(0, b, 1).narrow(2, start, len);
                    burns(cut(&q), cut(&k), cut(&v), window)
                })
                .collect();
            Tensor::cat(parts, 2)
        })
        .collect();
    Tensor::cat(rows, 0)
}

type Packed<'a> = &'a dyn Fn(Tensor<AD, 4>, Tensor<AD, 4>, Tensor<AD, 4>) -> Tensor<AD, 4>;

/// Values and gradients of `ours` against [`alone`] on random `q`, `k`, `v`
/// (`heads` query heads over `kv_heads`), relative to the largest value.
fn check(
    ours: Packed<'_>,
    heads: usize,
    kv_heads: usize,
    window: Option<usize>,
    documents: &Documents,
    what: &str,
) {
    let [batch, seq] = documents.dims();
    let (q, k, v) = (
        random([batch, heads, seq, 8], 1.0),
        random([batch, kv_heads, seq, 8], 1.0),
        random([batch, kv_heads, seq, 8], 1.0),
    );
    let weights = Tensor::<AD, 4>::random(
        [batch, heads, seq, 8],
        Distribution::Normal(0.0, 1.0),
        &Default::default(),
    );
    let got = ours(q.clone(), k.clone(), v.clone());
    let want = alone(q.clone(), k.clone(), v.clone(), window, documents);
    let close = |name: &str, a: Tensor<Flex, 4>, b: Tensor<Flex, 4>| {
        assert_eq!(a.dims(), b.dims(), "{what}: {name}");
        let largest: f32 = b.clone().abs().max().into_scalar().max(1.0);
        let diff: f32 = (a - b).abs().max().into_scalar() / largest;
        assert!(diff < 1e-5, "{what}: {name} differs by {diff}");
    };
    close("output", got.clone().inner(), want.clone().inner());
    let got = (got * weights.clone()).sum().backward();
    let want = (want * weights).sum().backward();
    for (name, t) in [("dq", &q), ("dk", &k), ("dv", &v)] {
        close(name, t.grad(&got).expect("dq"), t.grad(&want).expect("dk"));
    }
}

/// Rows of 13 positions (not a multiple of any tile below) packed three
/// ways, one row a single document; documents of one position; a boundary
/// every row shares (whole tiles before it are skipped).
fn layouts() -> Vec<Documents> {
    [
        vec![vec![0, 5, 6], vec![0], vec![0, 12]],
        vec![vec![0, 1, 2, 3, 7], vec![0, 4, 8, 9]],
        vec![vec![0, 6], vec![0, 3, 6, 10]],
    ]
    .into_iter()
    .map(|starts| Documents::new(13, starts).expect("valid starts"))
    .collect()
}

/// Grouped-query ratios 1, 4 and 8.
const HEADS: [(usize, usize); 3] = [(2, 2), (4, 1), (8, 1)];

#[test]
fn packed_attention_equals_each_document_alone() {
    assert!(has_custom_backward::<AD>());
    for documents in layouts() {
        for (heads, kv) in HEADS {
            let what = format!("{heads}/{kv} heads, {documents:?}");
            check(
                &|q, k, v| causal_attention_in(q, k, v, &documents),
                heads,
                kv,
                None,
                &documents,
                &format!("causal_attention_in, {what}"),
            );
            check(
                &|q, k, v| reference_attention_in(q, k, v, None, &documents),
                heads,
                kv,
                None,
                &documents,
                &format!("reference, {what}"),
            );
        }
    }
}

/// Chunks of rows, query blocks and key tiles that do not divide the 13
/// positions, key tiles of one and of several blocks.
#[test]
fn tiles_mask_and_skip_across_documents() {
    for documents in layouts() {
        for (heads, kv) in HEADS {
            for (chunk, block, key_tile) in [
                (1, 2, 2),
                (2, 3, 6),
                (3, 4, 4),
                (1, 1, 3),
                (2, 5, 10),
                (3, 13, 13),
            ] {
                let tiling = Tiling {
                    chunk,
                    block,
                    key_tile,
                };
                check(
                    &|q, k, v| causal_attention_tiled_in(q, k, v, tiling, &documents),
                    heads,
                    kv,
                    None,
                    &documents,
                    &format!("{tiling:?}, {heads}/{kv} heads, {documents:?}"),
                );
            }
        }
    }
}

/// A sliding window inside documents: windows of 1, 3 and 6 positions, and
/// one longer than the rows.
#[test]
fn windows_stay_inside_documents() {
    for documents in layouts() {
        for (heads, kv) in HEADS {
            for window in [1, 3, 6, 20] {
                let what = format!("window {window}, {heads}/{kv} heads, {documents:?}");
                check(
                    &|q, k, v| windowed_attention_in(q, k, v, window, &documents),
                    heads,
                    kv,
                    Some(window).filter(|&w| w < 13),
                    &documents,
                    &what,
                );
                check(
                    &|q, k, v| reference_attention_in(q, k, v, Some(window), &documents),
                    heads,
                    kv,
                    Some(window).filter(|&w| w < 13),
                    &documents,
                    &format!("reference, {what}"),
                );
            }
        }
    }
}

/// Without a graph (the engine's forward), the tiles give the values of the
/// tracked operation; one document a row is plain causal attention.
#[test]
fn graph_free_and_whole_rows_agree() {
    let device = Default::default();
    let documents = &layouts()[0];
    let randn = |shape| Tensor::<Flex, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let (q, k, v) = (
        randn([3, 4, 13, 8]),
        randn([3, 1, 13, 8]),
        randn([3, 1, 13, 8]),
    );
    let plain = causal_attention_in(q.clone(), k.clone(), v.clone(), documents);
    let lift = |t: &Tensor<Flex, 4>| Tensor::<AD, 4>::from_inner(t.clone());
    let tracked = causal_attention_in(lift(&q), lift(&k), lift(&v), documents).inner();
    let diff: f32 = (plain - tracked).abs().max().into_scalar();
    assert!(diff < 1e-6, "graph-free packed attention off by {diff}");
    let whole = Documents::whole(3, 13);
    let packed = causal_attention_in(q.clone(), k.clone(), v.clone(), &whole);
    let diff: f32 = (packed - super::super::causal_attention(q, k, v))
        .abs()
        .max()
        .into_scalar();
    assert!(diff < 1e-6, "one document a row off by {diff}");
}

/// A position never sees another document: changing every key and value of
/// a row's first document leaves its second document's outputs as they were.
#[test]
fn documents_do_not_see_each_other() {
    let device = Default::default();
    let documents = Documents::new(9, vec![vec![0, 4]]).expect("valid");
    let randn = |shape| Tensor::<Flex, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let (q, k, v) = (
        randn([1, 2, 9, 4]),
        randn([1, 2, 9, 4]),
        randn([1, 2, 9, 4]),
    );
    let before = causal_attention_in(q.clone(), k.clone(), v.clone(), &documents);
    let bump = |t: Tensor<Flex, 4>| {
        t.slice_assign(
            [0..1, 0..2, 0..4, 0..4],
            Tensor::ones([1, 2, 4, 4], &device) * 9.0,
        )
    };
    let after = causal_attention_in(q, bump(k), bump(v), &documents);
    let second = |t: Tensor<Flex, 4>| t.slice([0..1, 0..2, 4..9, 0..4]);
    let diff: f32 = (second(before.clone()) - second(after.clone()))
        .abs()
        .max()
        .into_scalar();
    assert!(diff < 1e-6, "the second document saw the first: {diff}");
    let first = |t: Tensor<Flex, 4>| t.slice([0..1, 0..2, 0..4, 0..4]);
    let diff: f32 = (first(before) - first(after)).abs().max().into_scalar();
    assert!(diff > 1e-3);
}
