//! The arithmetic of a merge step, as peft's on the CPU computes it: a row's delta as
//! sequential fused multiply-adds over the rank (four rows at once where they share
//! q), and how each kind of step adds it to the weight's row (see the module above).

use half::f16;

use crate::model::merge::MergeKind;
use crate::save::cast::round_to_bf16;
use crate::types::DType;

/// One step with its matrices read, in the orientation of the weight's rows:
/// `delta[i][j] = scale · Σ_k p[i·r + k] · q[k·cols + j]`.
pub(super) struct Loaded {
    pub(super) kind: MergeKind,
    pub(super) rank: usize,
    pub(super) p: Vec<f32>,
    pub(super) q: Vec<f32>,
    /// Rows that share one `r × cols` block of q, the next rows reading the next block
    /// (a tensor holding every expert); 0: one block for all rows.
    pub(super) q_block_rows: usize,
    pub(super) magnitude: Vec<f32>,
    pub(super) scale: f32,
    /// peft's `B @ A` has one row (a Linear with `out_features = 1`, such as
    /// Qwen2-MoE's `shared_expert_gate`): torch computes that product as a
    /// matrix-vector product, which rounds each product before adding it — no fused
    /// multiply-add. (Found against torch 2.15 on x86-64, AVX-512, MKL: for one row
    /// every element of 49 shapes up to rank 256 × 5,000 columns matched that rule
    /// and none matched the fused one; from four rows on, the fused sum matches.)
    pub(super) rounded_products: bool,
    /// q rearranged for [`fma_rows`], made on first use: for each block of q, for each
    /// panel of `LANES` columns, the panel's `rank` rows one after another (the tail
    /// columns past the last whole panel are read from q).
    pub(super) panels: std::sync::OnceLock<Vec<f32>>,
}

/// One step on one row `w`, rounding to the weight's dtype with `round`; `delta` is
/// scratch of one row.
pub(super) fn apply_with(
    step: &Loaded,
    i: usize,
    w: &mut [f32],
    delta: &mut [f32],
    round: impl Fn(f32) -> f32,
) {
    if let MergeKind::Bias = step.kind {
        for (j, v) in w.iter_mut().enumerate() {
            *v = round(*v + step.q[j] * step.scale);
        }
        return;
    }
    row_delta(step, i, delta);
    add_delta(step, i, w, delta, round);
}

/// One step on the rows of `block` (whole rows, the first of them row `first`): the
/// same values as [`apply_with`] row by row, with the deltas of [`ROWS`] rows computed
/// together (see [`fma_rows`]). `scratch` holds at least `ROWS` rows.
pub(super) fn apply_rows(
    step: &Loaded,
    (first, cols): (usize, usize),
    block: &mut [f32],
    scratch: &mut [f32],
    dtype: DType,
) {
    let at = (first, cols);
    // One copy of the loops per dtype, so the rounding inlines into them.
    match dtype {
        DType::BF16 => apply_rows_with(step, at, block, scratch, round_to_bf16),
        DType::F16 => apply_rows_with(step, at, block, scratch, |x| f16::from_f32(x).to_f32()),
        _ => apply_rows_with(step, at, block, scratch, |x| x),
    }
}

fn apply_rows_with(
    step: &Loaded,
    (first, cols): (usize, usize),
    block: &mut [f32],
    scratch: &mut [f32],
    round: impl Fn(f32) -> f32 + Copy,
) {
    if cols == 0 {
        return;
    }
    let rows = block.len() / cols;
    if matches!(step.kind, MergeKind::Bias) || step.rounded_products {
        for (i, w) in block.chunks_exact_mut(cols).enumerate() {
            apply_with(step, first + i, w, &mut scratch[..cols], round);
        }
        return;
    }
    let mut i = 0;
    while i < rows {
        // Rows that read one block of q (all of them, but for a tensor of experts).
        let n = match step.q_block_rows {
            0 => ROWS,
            block => block - (first + i) % block,
        }
        .min(ROWS)
        .min(rows - i);
        rows_delta(step, first + i, n, cols, scratch);
        for m in 0..n {
            let w = &mut block[(i + m) * cols..(i + m + 1) * cols];
            add_delta(
                step,
                first + i + m,
                w,
                &mut scratch[m * cols..(m + 1) * cols],
                round,
            );
        }
        i += n;
    }
}

/// Adds row `i`'s `delta` (scaled) to `w` as the step's kind says, rounding to the
/// weight's dtype with `round`.
fn add_delta(
    step: &Loaded,
    i: usize,
    w: &mut [f32],
    delta: &mut [f32],
    round: impl Fn(f32) -> f32,
) {
    match &step.kind {
        MergeKind::Linear {
            magnitude: Some(_), ..
        } => {
            // DoRA: W + delta, rescaled so the row's norm is the magnitude.
            for (d, v) in delta.iter_mut().zip(w.iter()) {
                *d += *v;
            }
            let norm = row_norm(delta);
            let factor = step.magnitude[i] / norm;
            for (v, d) in w.iter_mut().zip(delta.iter()) {
                *v = round(factor * *d);
            }
        }
        MergeKind::Linear { .. } => {
            for (v, d) in w.iter_mut().zip(delta.iter()) {
                *v = round(*v + *d);
            }
        }
        MergeKind::Embedding | MergeKind::Expert { .. } => {
            // peft casts an embedding's delta, and a fused experts parameter's (its
            // `param.data += delta` in the weight's dtype), to the weight's dtype before
            // adding.
            for (v, d) in w.iter_mut().zip(delta.iter()) {
                *v = round(*v + round(*d));
            }
        }
        MergeKind::Bias => {}
    }
}

/// A row's L2 norm as torch's `linalg.norm(dim=1)` computes it on the CPU for a
/// contiguous float row: eight f32 lanes of `acc += x·x` (a multiply, then an add),
/// the lanes summed in order, the tail added one by one, then the square root. (Found
/// by experiment against torch; it matches every row, with AVX-512 too, because
/// torch's `Vectorized<float>` in that kernel is eight lanes wide.)
fn row_norm(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let full = v.len() - v.len() % 8;
    for chunk in v[..full].chunks_exact(8) {
        for (acc, &x) in lanes.iter_mut().zip(chunk) {
            *acc += x * x;
        }
    }
    let mut sum = lanes[0];
    for &lane in &lanes[1..] {
        sum += lane;
    }
    for &x in &v[full..] {
        sum += x * x;
    }
    sum.sqrt()
}

/// `delta[j] = scale · Σ_k p[i][k]·q[k][j]` for one row, summed over the rank in order:
/// each step a fused multiply-add in f32, or for `rounded_products` the product rounded
/// to f32 before the add (Rust never fuses the two on its own). The merge sums fused
/// rows through [`rows_delta`], to these same values; this one row at a time serves the
/// rounded products, and the tests as the sum written plainly.
pub(super) fn row_delta(step: &Loaded, i: usize, delta: &mut [f32]) {
    delta.fill(0.0);
    let cols = delta.len();
    let p = &step.p[i * step.rank..(i + 1) * step.rank];
    let q = match step.q_block_rows {
        0 => &step.q[..],
        block => &step.q[(i / block) * step.rank * cols..],
    };
    for (k, &pk) in p.iter().enumerate() {
        for (d, &x) in delta.iter_mut().zip(&q[k * cols..(k + 1) * cols]) {
            *d = if step.rounded_products {
                *d + pk * x
            } else {
                pk.mul_add(x, *d)
            };
        }
    }
    for d in delta.iter_mut() {
        *d *= step.scale;
    }
}

/// Rows a merge's deltas are computed for at once.
pub(super) const ROWS: usize = 4;
/// Columns of those rows held in registers at once: `ROWS × LANES` sums, eight
/// AVX2 registers, enough independent sums to keep both FMA units busy.
const LANES: usize = 16;

/// The deltas of rows `first..first + n` (`n ≤ ROWS`, all reading one block of q)
/// into `out`, row after row: the values [`row_delta`] gives each row.
fn rows_delta(step: &Loaded, first: usize, n: usize, cols: usize, out: &mut [f32]) {
    let rank = step.rank;
    let block = match step.q_block_rows {
        0 => 0,
        rows => first / rows,
    };
    let q = &step.q[block * rank * cols..][..rank * cols];
    let panels = step.panels.get_or_init(|| panels_of(&step.q, rank, cols));
    let per_block = cols / LANES * LANES * rank;
    let panels = &panels[block * per_block..][..per_block];
    // Rows past `n` repeat the last one: the kernel always computes ROWS rows.
    let p: [&[f32]; ROWS] = std::array::from_fn(|m| {
        let i = first + m.min(n - 1);
        &step.p[i * rank..(i + 1) * rank]
    });
    fma_rows(p, (panels, q), cols, step.scale, &mut out[..ROWS * cols]);
}

/// q (blocks of `rank × cols`) as [`Loaded::panels`] lays it out.
fn panels_of(q: &[f32], rank: usize, cols: usize) -> Vec<f32> {
    let full = cols / LANES * LANES;
    let mut panels = Vec::with_capacity(q.len() / cols.max(1) * full);
    for block in q.chunks_exact((rank * cols).max(1)) {
        for j0 in (0..full).step_by(LANES) {
            for k in 0..rank {
                panels.extend_from_slice(&block[k * cols + j0..][..LANES]);
            }
        }
    }
    panels
}

/// `out[m][j] = scale · Σ_k p[m][k]·q[k][j]` for ROWS rows: the sum over the rank in
/// order as fused multiply-adds from zero, then the scale — [`row_delta`]'s
/// arithmetic, element for element. A panel of `LANES` columns of every row is summed
/// in registers through the whole rank, reading the panel's part of q in one stretch,
/// so each load of q feeds ROWS multiply-adds and the sums never go through memory
/// (one row at a time, a step was three loads and a store per two multiply-adds,
/// striding through q). The columns past the last whole panel come from q itself.
#[multiversion::multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn fma_rows(
    p: [&[f32]; ROWS],
    (panels, q): (&[f32], &[f32]),
    cols: usize,
    scale: f32,
    out: &mut [f32],
) {
    let rank = q.len() / cols.max(1);
    let p = p.map(|row| &row[..rank]);
    let full = cols - cols % LANES;
    for (n, j0) in (0..full).step_by(LANES).enumerate() {
        // (Indexed rather than chunked: a rank of 0 has empty panels, and still zero sums.)
        let panel = &panels[n * rank * LANES..][..rank * LANES];
        let mut sums = [[0f32; LANES]; ROWS];
        for (k, qk) in panel.chunks_exact(LANES).enumerate() {
            for (sum, p) in sums.iter_mut().zip(&p) {
                let pk = p[k];
                for (s, &x) in sum.iter_mut().zip(qk) {
                    *s = pk.mul_add(x, *s);
                }
            }
        }
        for (m, sum) in sums.iter().enumerate() {
            for (o, s) in out[m * cols + j0..][..LANES].iter_mut().zip(sum) {
                *o = s * scale;
            }
        }
    }
    for j in full..cols {
        for (m, p) in p.iter().enumerate() {
            let mut s = 0f32;
            for (k, &pk) in p.iter().enumerate() {
                s = pk.mul_add(q[k * cols + j], s);
            }
            out[m * cols + j] = s * scale;
        }
    }
}
