//! LoRA merges as peft computes them on the CPU (`merge_and_unload`), streamed by
//! blocks of whole rows: memory is the adapter pair in f32 plus one block, never a
//! whole weight. The saver writes what [`stream`] yields and `devmap verify` hashes it,
//! so both compute a merged value the same way.
//!
//! The delta of a row is `scale · Σ_k P[i][k]·Q[k][j]`, summed over the rank in order
//! as fused multiply-adds, which is how torch's CPU matmul sums it with MKL's FMA GEMM
//! on x86-64 (within one ulp, ≥ 99.5% bit-identical: the real-peft test checks). A BLAS
//! that does not fuse (MKL_CBWR=COMPATIBLE) rounds each product; devmap's sum is then
//! the more exact one (docs/guide.md gives the bound CI checks). The loop over output columns is vectorised (AVX2+FMA where
//! the CPU has it, chosen at run time by the `multiversion` crate); the rank loop stays
//! sequential. A general GEMM crate would reorder the sum and lose bit-equality.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use half::f16;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::model::merge::{Matrix, MergeKind, MergeStep};
use crate::types::dtype::DType;
use crate::types::range::FileId;

/// Bytes of f32 rows processed at a time (at least one row): small enough that a
/// block stays in the CPU's cache through every step.
const BLOCK_BYTES: usize = 256 << 10;

/// Buffers of finished merges, kept for the next: a fresh allocation per tensor costs
/// page faults and zeroing that showed as a sixth of a merge's time.
static SPARE: std::sync::Mutex<Vec<Buffers>> = std::sync::Mutex::new(Vec::new());

#[derive(Default)]
struct Buffers {
    raw: Vec<u8>,
    values: Vec<f32>,
    scratch: Vec<f32>,
    out: Vec<u8>,
}

impl Buffers {
    fn take() -> Buffers {
        SPARE
            .lock()
            .ok()
            .and_then(|mut spare| spare.pop())
            .unwrap_or_default()
    }

    fn give_back(self) {
        if let Ok(mut spare) = SPARE.lock()
            && spare.len() < 8
        {
            spare.push(self);
        }
    }
}

/// `v` with at least `n` elements (grown once, never shrunk).
fn at_least<T: Default + Clone>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// One step with its matrices read, in the orientation of the weight's rows:
/// `delta[i][j] = scale · Σ_k p[i·r + k] · q[k·cols + j]`.
struct Loaded {
    kind: MergeKind,
    rank: usize,
    p: Vec<f32>,
    q: Vec<f32>,
    /// Rows that share one `r × cols` block of q, the next rows reading the next block
    /// (a tensor holding every expert); 0: one block for all rows.
    q_block_rows: usize,
    magnitude: Vec<f32>,
    scale: f32,
    /// peft's `B @ A` has one row (a Linear with `out_features = 1`, such as
    /// Qwen2-MoE's `shared_expert_gate`): torch computes that product as a
    /// matrix-vector product, which rounds each product before adding it — no fused
    /// multiply-add. (Found against torch 2.15 on x86-64, AVX-512, MKL: for one row
    /// every element of 49 shapes up to rank 256 × 5,000 columns matched that rule
    /// and none matched the fused one; from four rows on, the fused sum matches.)
    rounded_products: bool,
    /// q rearranged for [`fma_rows`], made on first use: for each block of q, for each
    /// panel of `LANES` columns, the panel's `rank` rows one after another (the tail
    /// columns past the last whole panel are read from q).
    panels: std::sync::OnceLock<Vec<f32>>,
}

/// What a merge reads: tensor `id` of `ckpt`, stored as `dtypes.0` at `src` (file,
/// offset; `len` bytes), written as `dtypes.1`; `open` opens an adapter's weight file,
/// `cancel` says when to stop.
#[derive(Clone, Copy)]
pub struct MergeInput<'a> {
    pub ckpt: &'a Checkpoint,
    pub id: TensorId,
    pub src: (&'a File, u64),
    pub len: u64,
    pub dtypes: (DType, DType),
    pub open: &'a (dyn Fn(FileId) -> io::Result<File> + Sync),
    pub cancel: &'a (dyn Stop + Sync),
    /// For an FP8 weight (`dtypes.0`): its block scales. The weight is dequantized and
    /// rounded to `dtypes.1` first — what transformers loads — and merged in that dtype.
    pub dequant: Option<&'a super::dequant::Fp8Rows>,
}

/// Streams the merged value of `input`'s tensor, converted to its output dtype, into
/// `sink` one block of rows at a time.
pub fn stream(
    input: MergeInput<'_>,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let (rows, cols) = layout(input.ckpt, input.id, input.dtypes.0, input.len)?;
    stream_rows(input, ((rows, cols), 0..rows), sink)
}

/// Writes the merged value of `input`'s tensor at `(dst, dst_offset)`, its rows split
/// among `threads` threads (each reads, merges and writes its own rows in place), and
/// returns the bytes written. The value is the one [`stream`] yields.
pub fn write_in_parallel(
    input: MergeInput<'_>,
    (dst, dst_offset): (&File, u64),
    threads: usize,
) -> Result<u64, CopyError> {
    let (rows, cols) = layout(input.ckpt, input.id, input.dtypes.0, input.len)?;
    let out_row = (cols * input.dtypes.1.size() as usize) as u64;
    super::copy::write_parts_in_parallel(
        rows as u64,
        out_row,
        threads as u64,
        (dst, dst_offset),
        &|range, sink| {
            let range = range.start as usize..range.end as usize;
            stream_rows(input, ((rows, cols), range), sink)
        },
    )?;
    Ok(rows as u64 * out_row)
}

/// `(rows, cols)` of a merged tensor, checked against its stored length.
fn layout(
    ckpt: &Checkpoint,
    id: TensorId,
    from: DType,
    len: u64,
) -> Result<(usize, usize), CopyError> {
    let tensor = &ckpt.tensors()[id];
    let dims: Vec<u64> = tensor.shape.iter().collect();
    let (rows, cols) = match dims.as_slice() {
        [n] => (1, *n as usize),
        [r, c] => (*r as usize, *c as usize),
        // Fused experts `[E, out, in]`: E·out rows of `in`.
        [lead @ .., c] if !lead.is_empty() => (lead.iter().product::<u64>() as usize, *c as usize),
        _ => (1, tensor.numel() as usize),
    };
    let size = from.size() as usize;
    if (rows * cols * size) as u64 != len {
        return Err(CopyError::Io(io::Error::other(format!(
            "tensor `{}` holds {len} bytes, its shape needs {}",
            tensor.name,
            rows * cols * size
        ))));
    }
    Ok((rows, cols))
}

/// The merge of rows `range` of `input`'s tensor (laid out as [`layout`] says),
/// streamed in order.
fn stream_rows(
    input: MergeInput<'_>,
    ((rows, cols), range): ((usize, usize), std::ops::Range<usize>),
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let MergeInput {
        ckpt,
        id,
        src: (src, offset),
        dtypes: (from, to),
        open,
        cancel,
        dequant,
        ..
    } = input;
    // The dtype the merge works in: the stored one, or for an FP8 weight the one it
    // is dequantized to.
    let work = if dequant.is_some() { to } else { from };
    let steps: Vec<Loaded> = ckpt
        .merges_of(id)
        .iter()
        .map(|s| load(s, rows, cols, open))
        .collect::<Result<_, _>>()
        .map_err(CopyError::Io)?;
    let size = from.size() as usize;
    let block_rows = (BLOCK_BYTES / (cols.max(1) * 4)).max(1);
    let allow_nonfinite = ckpt.merges_of(id).iter().all(|s| s.allow_nonfinite);
    let mut buffers = Buffers::take();
    let result = (|| {
        let Buffers {
            raw,
            values,
            scratch,
            out,
        } = &mut buffers;
        let scratch = at_least(scratch, ROWS * cols);
        let mut row = range.start;
        while row < range.end {
            if cancel.stop() {
                return Err(CopyError::Cancelled);
            }
            let n = block_rows.min(range.end - row);
            let bytes = at_least(raw, n * cols * size);
            read_exact_at(src, bytes, offset + (row * cols * size) as u64)?;
            let block = at_least(values, n * cols);
            let base: &mut [u8] = if let Some(fp8) = dequant {
                fp8.values(row as u64, bytes, block);
                for v in block.iter_mut() {
                    *v = round_to(work, *v);
                }
                let base = at_least(out, n * cols * work.size() as usize);
                narrow(work, block, base);
                base
            } else {
                widen(from, bytes, block);
                bytes
            };
            for step in &steps {
                apply_rows(step, (row, cols), block, scratch, work);
            }
            if !allow_nonfinite {
                refuse_overflow(
                    &ckpt.tensors()[id].name,
                    (work, to),
                    base,
                    block,
                    row * cols,
                )?;
            }
            narrow(work, block, base);
            if to == work {
                sink(base).map_err(CopyError::Io)?;
            } else {
                let converted = at_least(out, n * cols * to.size() as usize);
                super::cast::cast(from, to, bytes, converted);
                sink(converted).map_err(CopyError::Io)?;
            }
            row += n;
        }
        Ok(())
    })();
    buffers.give_back();
    result
}

/// A tensor's LoRA merges, loaded, for rows another stream makes: an MXFP4 weight's
/// dequantized rows (`save::mxfp4`), merged as peft merges into the model transformers
/// loads dequantized. The tensor is `rows × cols` as the merge sees it.
pub struct RowMerger {
    name: String,
    steps: Vec<Loaded>,
    allow_nonfinite: bool,
    cols: usize,
}

impl RowMerger {
    /// Reads the adapter matrices of every merge into tensor `id`.
    pub fn load(
        ckpt: &Checkpoint,
        id: TensorId,
        (rows, cols): (u64, u64),
        open: &(dyn Fn(FileId) -> io::Result<File> + Sync),
    ) -> Result<RowMerger, CopyError> {
        let (rows, cols) = (rows as usize, cols as usize);
        let merges = ckpt.merges_of(id);
        let steps = merges
            .iter()
            .map(|s| load(s, rows, cols, open))
            .collect::<Result<_, _>>()
            .map_err(CopyError::Io)?;
        Ok(RowMerger {
            name: ckpt.tensors()[id].name.to_string(),
            steps,
            allow_nonfinite: merges.iter().all(|s| s.allow_nonfinite),
            cols,
        })
    }

    /// Merges into `rows` (whole rows of `dtype`, the first of them row `first`), in
    /// place, in that dtype.
    pub fn merge(&self, first: usize, dtype: DType, rows: &mut [u8]) -> Result<(), CopyError> {
        // The kept buffers, as a streamed merge uses them: a band is merged per call.
        let mut buffers = Buffers::take();
        let values = at_least(&mut buffers.values, rows.len() / dtype.size() as usize);
        let scratch = at_least(&mut buffers.scratch, ROWS * self.cols);
        widen(dtype, rows, values);
        for step in &self.steps {
            apply_rows(step, (first, self.cols), values, scratch, dtype);
        }
        let result = if self.allow_nonfinite {
            Ok(())
        } else {
            refuse_overflow(&self.name, (dtype, dtype), rows, values, first * self.cols)
        };
        if result.is_ok() {
            narrow(dtype, values, rows);
        }
        buffers.give_back();
        result
    }
}

/// Stops the save when the merge made an element that was finite NaN or infinite (a
/// huge `lora_alpha`, or a sum past the dtype's range), or one that the cast to `to`
/// would make infinite: naming the tensor and the element, before anything is kept.
fn refuse_overflow(
    name: &str,
    (from, to): (DType, DType),
    before: &[u8],
    after: &[f32],
    first: usize,
) -> Result<(), CopyError> {
    // The largest finite value `to` holds, plus half its last step: past it, a cast
    // rounds to infinity (float32 and bfloat16 share float32's range).
    let limit = if to == DType::F16 {
        65520.0
    } else {
        f32::INFINITY
    };
    // Below the limit means finite too (NaN compares false). The whole band is
    // checked first without stopping early, which the compiler vectorises: an
    // element-by-element loop with an exit took as long as the merge's arithmetic.
    let fits = |v: f32| v.abs() < limit;
    if after.iter().fold(true, |all, &v| all & fits(v)) {
        return Ok(());
    }
    let size = from.size() as usize;
    for (k, v) in after.iter().enumerate() {
        if fits(*v) {
            continue;
        }
        let mut was = [0f32];
        widen(from, &before[k * size..(k + 1) * size], &mut was);
        if was[0].is_finite() {
            return Err(CopyError::Io(io::Error::other(format!(
                "merging the adapter into `{}` makes element {} {} (it was {}): the result does not fit {to}. Nothing was kept; pass --allow-nonfinite to write it anyway",
                crate::text::escaped(name),
                first + k,
                v,
                was[0]
            ))));
        }
    }
    Ok(())
}

/// One step on one row `w`, rounding to the weight's dtype with `round`; `delta` is
/// scratch of one row.
fn apply_with(
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
/// same values as [`apply`] row by row, with the deltas of [`ROWS`] rows computed
/// together (see [`fma_rows`]). `scratch` holds at least `ROWS` rows.
fn apply_rows(
    // One copy of the loops per dtype, so the rounding inlines into them.
    step: &Loaded,
    (first, cols): (usize, usize),
    block: &mut [f32],
    scratch: &mut [f32],
    dtype: DType,
) {
    let at = (first, cols);
    match dtype {
        DType::BF16 => apply_rows_with(step, at, block, scratch, round_bf16),
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

/// `delta[j] = scale · Σ_k p[i][k]·q[k][j]`, each step a fused multiply-add in f32.
fn row_delta(step: &Loaded, i: usize, delta: &mut [f32]) {
    delta.fill(0.0);
    let cols = delta.len();
    let p = &step.p[i * step.rank..(i + 1) * step.rank];
    let q = match step.q_block_rows {
        0 => &step.q[..],
        block => &step.q[(i / block) * step.rank * cols..],
    };
    if step.rounded_products {
        for (k, &pk) in p.iter().enumerate() {
            add_products(pk, &q[k * cols..(k + 1) * cols], delta);
        }
        for d in delta.iter_mut() {
            *d *= step.scale;
        }
        return;
    }
    // Two steps per pass over the row: the same fused multiply-adds in the same order,
    // with half the trips of the row through memory.
    let mut k = 0;
    while k + 1 < step.rank {
        fma_row2(
            (p[k], p[k + 1]),
            (
                &q[k * cols..(k + 1) * cols],
                &q[(k + 1) * cols..(k + 2) * cols],
            ),
            delta,
        );
        k += 2;
    }
    if k < step.rank {
        fma_row(p[k], &q[k * cols..(k + 1) * cols], delta);
    }
    for d in delta.iter_mut() {
        *d *= step.scale;
    }
}

/// Rows a merge's deltas are computed for at once.
const ROWS: usize = 4;
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
    for (panel, j0) in panels
        .chunks_exact((rank * LANES).max(1))
        .zip((0..full).step_by(LANES))
    {
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

/// `d[j] = d[j] + p·q[j]`, the product rounded to f32 before the add (Rust never fuses
/// the two on its own).
fn add_products(p: f32, q: &[f32], d: &mut [f32]) {
    for (d, &q) in d.iter_mut().zip(q) {
        *d += p * q;
    }
}

/// [`fma_row`] for two consecutive steps: `d = fma(p1, q1, fma(p0, q0, d))`.
#[multiversion::multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn fma_row2((p0, p1): (f32, f32), (q0, q1): (&[f32], &[f32]), d: &mut [f32]) {
    for ((d, &a), &b) in d.iter_mut().zip(q0).zip(q1) {
        *d = p1.mul_add(b, p0.mul_add(a, *d));
    }
}

/// `d[j] = fma(p, q[j], d[j])` for every column: one rounding per step, as a hardware
/// fused multiply-add gives. Compiled for AVX2+FMA (eight lanes) and chosen at run
/// time where the CPU has it; elsewhere `mul_add` is still exact, only slower.
#[multiversion::multiversion(targets("x86_64+avx2+fma", "aarch64+neon"))]
fn fma_row(p: f32, q: &[f32], d: &mut [f32]) {
    for (d, &q) in d.iter_mut().zip(q) {
        *d = p.mul_add(q, *d);
    }
}

/// Reads a step's matrices as f32 and lays them out by the weight's rows.
fn load(
    step: &MergeStep,
    rows: usize,
    cols: usize,
    open: &(dyn Fn(FileId) -> io::Result<File> + Sync),
) -> io::Result<Loaded> {
    let b = read_matrix(&step.b, open)?;
    let rank = step.rank as usize;
    let mut q_block_rows = 0;
    let mut rounded_products = false;
    let (p, q) = match (&step.kind, &step.a) {
        (MergeKind::Bias, _) => (Vec::new(), b),
        (
            &MergeKind::Expert {
                expert,
                experts,
                delta_row,
                transposed,
            },
            Some(a),
        ) => {
            let a = read_matrix(a, open)?;
            let factors = if transposed {
                transposed_expert_factors(&a, &b, (rows, cols, rank), experts)
            } else {
                expert_factors(&a, &b, (rows, cols, rank), (expert, experts, delta_row))
            };
            let Some((p, q, block)) = factors else {
                return Err(io::Error::other(
                    "an expert's LoRA slice lies outside its matrices",
                ));
            };
            q_block_rows = block;
            (p, q)
        }
        (kind, Some(a)) => {
            let a = read_matrix(a, open)?;
            let transposed = matches!(
                kind,
                MergeKind::Embedding
                    | MergeKind::Linear {
                        fan_in_fan_out: true,
                        ..
                    }
            );
            if transposed {
                // delta[i][j] = Σ_k A[k][i]·B[j][k]: p = Aᵀ (rows × r), q = Bᵀ (r × cols).
                // peft's `B @ A` has `cols` rows here.
                rounded_products = cols == 1;
                (transpose(&a, rank, rows), transpose(&b, cols, rank))
            } else {
                // delta[i][j] = Σ_k B[i][k]·A[k][j]: p = B (rows × r), q = A (r × cols).
                rounded_products = rows == 1;
                (b, a)
            }
        }
        (_, None) => return Err(io::Error::other("a LoRA step without its A matrix")),
    };
    let magnitude = match &step.kind {
        MergeKind::Linear {
            magnitude: Some(m), ..
        } => read_matrix(m, open)?,
        _ => Vec::new(),
    };
    Ok(Loaded {
        kind: step.kind.clone(),
        rank,
        p,
        q,
        q_block_rows,
        magnitude,
        scale: step.scale,
        rounded_products,
        panels: std::sync::OnceLock::new(),
    })
}

/// The factors of a LoRA on a fused experts parameter for the weight's rows (A
/// `[r·E, in]`, B `[out, r·E]`: expert e's delta is `Σ_k B[o][k·E+e]·A[e·r+k]`). For one
/// expert's tensor (`expert` given), its rows are delta rows `delta_row…`: p is
/// `rows × r`, q that expert's `r × cols` block of A. For a tensor that holds every
/// expert (`[E, out, in]`, rows E·out), row i is expert `i / out`'s delta row `i % out`:
/// q is all of A, and each row reads its expert's block (the returned block height,
/// `out` rows; 0 when q is one block).
fn expert_factors(
    lora_a: &[f32],
    lora_b: &[f32],
    (rows, cols, rank): (usize, usize, usize),
    (expert, experts, delta_row): (Option<u64>, u64, u64),
) -> Option<(Vec<f32>, Vec<f32>, usize)> {
    let count = experts as usize;
    let wide = rank * count;
    let out = (lora_b.len() / wide.max(1)).max(1);
    // B's entries that multiply A's rows for delta row `row` of expert `e`.
    let b_row = |row: usize, e: usize| (0..rank).map(move |k| row * wide + k * count + e);
    let picked = |(row, e): (usize, usize)| b_row(row, e).map(|at| lora_b.get(at).copied());
    if let Some(e) = expert {
        let e = e as usize;
        let p = (0..rows)
            .map(|i| (delta_row as usize + i, e))
            .flat_map(picked)
            .collect::<Option<Vec<f32>>>()?;
        let q = lora_a.get(e * rank * cols..(e + 1) * rank * cols)?.to_vec();
        return Some((p, q, 0));
    }
    if lora_a.len() != count * rank * cols || rows != count * out {
        return None;
    }
    let p = (0..rows)
        .map(|i| (i % out, i / out))
        .flat_map(picked)
        .collect::<Option<Vec<f32>>>()?;
    let factors = (p, lora_a.to_vec(), out);
    Some(factors)
}

/// [`expert_factors`] for a tensor of every expert stored `[E, in, out]` (gpt-oss's,
/// and an MXFP4 weight dequantized): peft's delta is each expert's `(B·A)ᵀ`, so row
/// `i` (expert `i / in`, input `i % in`) is `Σ_k A[e·r+k][i % in] · B[:, k·E+e]`: p is
/// A's columns per row, q expert e's `r × out` block of B's columns (block height
/// `in` rows).
fn transposed_expert_factors(
    lora_a: &[f32],
    lora_b: &[f32],
    (rows, cols, rank): (usize, usize, usize),
    experts: u64,
) -> Option<(Vec<f32>, Vec<f32>, usize)> {
    let count = experts as usize;
    let wide = rank * count;
    if count == 0 || rows % count != 0 || lora_b.len() != cols * wide {
        return None;
    }
    let inputs = rows / count;
    if lora_a.len() != wide * inputs {
        return None;
    }
    let mut p = Vec::with_capacity(rows * rank);
    for i in 0..rows {
        let (e, input) = (i / inputs, i % inputs);
        p.extend((0..rank).map(|k| lora_a[(e * rank + k) * inputs + input]));
    }
    let mut q = Vec::with_capacity(count * rank * cols);
    for e in 0..count {
        for k in 0..rank {
            q.extend((0..cols).map(|o| lora_b[o * wide + k * count + e]));
        }
    }
    Some((p, q, inputs))
}

/// `m` (`r × c`, row-major) transposed.
fn transpose(m: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = m[i * c + j];
        }
    }
    t
}

fn read_matrix(
    m: &Matrix,
    open: &(dyn Fn(FileId) -> io::Result<File> + Sync),
) -> io::Result<Vec<f32>> {
    if !matches!(m.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(io::Error::other(format!(
            "an adapter matrix is {}; devmap reads float32, float16 and bfloat16",
            m.dtype
        )));
    }
    let file = open(m.range.file)?;
    let mut bytes = vec![0u8; m.range.len as usize];
    file.read_exact_at(&mut bytes, m.range.offset)?;
    let mut values = vec![0f32; bytes.len() / m.dtype.size() as usize];
    widen(m.dtype, &bytes, &mut values);
    Ok(values)
}

/// Little-endian elements of `dtype` to f32 (exact for the three dtypes merged).
fn widen(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// f32 values (already representable in `dtype`) to little-endian `dtype` bytes.
fn narrow(dtype: DType, values: &[f32], out: &mut [u8]) {
    match dtype {
        DType::BF16 => {
            // The values are bfloat16 already (rounded by the merge): the top half.
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        _ => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// `x` rounded to bfloat16 (to nearest, ties to even, as torch's conversion) and
/// back, on the bits: branch-free but for NaN, so the loops around it vectorise.
#[inline]
/// `x` rounded to `dtype` as torch's `.to()` rounds (held as f32).
fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => round_bf16(x),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    if x.is_nan() {
        return f32::from_bits(0x7FC0_0000);
    }
    f32::from_bits(bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000)
}

#[cfg(test)]
// Bit-exact comparisons are the point of these tests; matrix names follow the maths.
#[allow(clippy::float_cmp, clippy::many_single_char_names)]
mod tests {
    use super::*;

    /// The straightforward reference: delta in f64 from the definition, no streaming.
    fn reference(b: &[f32], a: &[f32], out: usize, r: usize, inp: usize, scale: f32) -> Vec<f64> {
        let mut d = vec![0f64; out * inp];
        for i in 0..out {
            for j in 0..inp {
                let s: f64 = (0..r)
                    .map(|k| f64::from(b[i * r + k]) * f64::from(a[k * inp + j]))
                    .sum();
                d[i * inp + j] = s * f64::from(scale);
            }
        }
        d
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97)
                    % 2001;
                (x as f32 - 1000.0) / 333.0
            })
            .collect()
    }

    #[test]
    fn the_delta_agrees_with_the_definition_within_f32_rounding() {
        let (out, r, inp) = (7, 3, 5);
        let (a, b) = (values(r * inp, 1), values(out * r, 2));
        let step = Loaded {
            kind: MergeKind::Linear {
                fan_in_fan_out: false,
                magnitude: None,
            },
            rank: r,
            p: b.clone(),
            q: a.clone(),
            q_block_rows: 0,
            magnitude: Vec::new(),
            scale: 0.5,
            rounded_products: false,
            panels: std::sync::OnceLock::new(),
        };
        let want = reference(&b, &a, out, r, inp, 0.5);
        let mut delta = vec![0f32; inp];
        for i in 0..out {
            row_delta(&step, i, &mut delta);
            for j in 0..inp {
                let w = want[i * inp + j];
                assert!(
                    (f64::from(delta[j]) - w).abs()
                        <= 4.0 * f64::from(f32::EPSILON) * w.abs().max(1.0),
                    "[{i}][{j}]: {} vs {w}",
                    delta[j]
                );
            }
        }
    }

    #[test]
    fn the_rank_sum_is_sequential_fused_multiply_adds() {
        // 1 + 3e-8 rounds back to 1 (below half an ulp), twice; the exact sum
        // 1 + 6e-8 is above half an ulp and would round up.
        let step = Loaded {
            kind: MergeKind::Linear {
                fan_in_fan_out: false,
                magnitude: None,
            },
            rank: 3,
            p: vec![1.0, 1.0, 1.0],
            q: vec![1.0, 3e-8, 3e-8],
            q_block_rows: 0,
            magnitude: Vec::new(),
            scale: 1.0,
            rounded_products: false,
            panels: std::sync::OnceLock::new(),
        };
        let mut delta = vec![0f32; 1];
        row_delta(&step, 0, &mut delta);
        assert_eq!(delta[0], 1.0);
        let once = (1.0f64 + 2.0 * f64::from(3e-8f32)) as f32;
        assert!(once > 1.0, "the example must tell the two orders apart");
    }

    #[test]
    fn a_one_row_delta_rounds_each_product_before_adding() {
        // p·q = (1 + 2⁻²³)(1 - 2⁻²⁴) = 1 + 2⁻²⁴ - 2⁻⁴⁷: a fused sum from -1 keeps
        // 2⁻²⁴ - 2⁻⁴⁷, the rounded product is 1 (round to even), so the sum is 0.
        let p = 1.0 + f32::EPSILON;
        let q = 1.0 - f32::EPSILON / 2.0;
        let step = |rounded_products| Loaded {
            kind: MergeKind::Linear {
                fan_in_fan_out: false,
                magnitude: None,
            },
            rank: 2,
            p: vec![1.0, p],
            q: vec![-1.0, q],
            q_block_rows: 0,
            magnitude: Vec::new(),
            scale: 1.0,
            rounded_products,
            panels: std::sync::OnceLock::new(),
        };
        let mut delta = vec![0f32; 1];
        row_delta(&step(true), 0, &mut delta);
        assert_eq!(delta[0], 0.0);
        row_delta(&step(false), 0, &mut delta);
        assert!(
            delta[0] > 0.0,
            "the fused sum keeps the low bits: {}",
            delta[0]
        );
    }

    #[test]
    fn transposed_layouts_read_a_and_b_by_columns() {
        let (r, num, dim) = (2, 3, 4);
        let a = values(r * num, 3); // [r, num]
        let b = values(dim * r, 4); // [dim, r]
        let step = Loaded {
            kind: MergeKind::Embedding,
            rank: r,
            p: transpose(&a, r, num),
            q: transpose(&b, dim, r),
            q_block_rows: 0,
            magnitude: Vec::new(),
            scale: 1.0,
            rounded_products: false,
            panels: std::sync::OnceLock::new(),
        };
        let mut delta = vec![0f32; dim];
        for n in 0..num {
            row_delta(&step, n, &mut delta);
            for d in 0..dim {
                let want: f64 = (0..r)
                    .map(|k| f64::from(b[d * r + k]) * f64::from(a[k * num + n]))
                    .sum();
                assert!((f64::from(delta[d]) - want).abs() < 1e-5, "[{n}][{d}]");
            }
        }
    }

    #[test]
    fn linear_rounds_once_and_embedding_twice() {
        // bf16 keeps 8 significant bits: next to 1 it steps by 2^-7, so 1 + 2^-8 is a
        // tie. A delta just above 2^-8 tips one rounding up, while rounding the delta
        // to bf16 first lands on the tie, which goes to even (1).
        let delta_value = 2f32.powi(-8) + 2f32.powi(-20);
        let step = |kind| Loaded {
            kind,
            rank: 1,
            p: vec![1.0],
            q: vec![delta_value],
            q_block_rows: 0,
            magnitude: Vec::new(),
            scale: 1.0,
            rounded_products: false,
            panels: std::sync::OnceLock::new(),
        };
        let mut scratch = [0f32; ROWS];
        let mut w = [1.0f32];
        let linear = MergeKind::Linear {
            fan_in_fan_out: false,
            magnitude: None,
        };
        apply_rows(&step(linear), (0, 1), &mut w, &mut scratch, DType::BF16);
        assert_eq!(w[0], 1.0 + 2f32.powi(-7));
        let mut e = [1.0f32];
        apply_rows(
            &step(MergeKind::Embedding),
            (0, 1),
            &mut e,
            &mut scratch,
            DType::BF16,
        );
        assert_eq!(e[0], 1.0);
    }

    #[test]
    fn dora_rescales_each_row_to_its_magnitude() {
        let step = Loaded {
            kind: MergeKind::Linear {
                fan_in_fan_out: false,
                magnitude: Some(Matrix {
                    range: crate::types::range::ByteRange {
                        file: 0,
                        offset: 0,
                        len: 0,
                    },
                    dtype: DType::F32,
                    rows: 1,
                    cols: 1,
                }),
            },
            rank: 1,
            p: vec![1.0],
            q: vec![0.0, 1.0],
            q_block_rows: 0,
            magnitude: vec![10.0],
            scale: 1.0,
            rounded_products: false,
            panels: std::sync::OnceLock::new(),
        };
        let mut w = [3.0f32, 3.0];
        let mut scratch = [0f32; 2 * ROWS];
        apply_rows(&step, (0, 2), &mut w, &mut scratch, DType::F32);
        // W + delta = [3, 4], norm 5, magnitude 10: doubled.
        assert_eq!(w, [6.0, 8.0]);
    }

    /// The deltas of four rows at once are each row's own, bit for bit: for every
    /// kind, dtype, a column count that is not a multiple of the lanes, a row count
    /// that is not one of the rows at once, and experts' blocks that end mid-group.
    #[test]
    fn rows_at_once_equal_the_rows_one_by_one() {
        let magnitude_matrix = Matrix {
            range: crate::types::range::ByteRange {
                file: 0,
                offset: 0,
                len: 0,
            },
            dtype: DType::F32,
            rows: 1,
            cols: 1,
        };
        let (rows, rank) = (11usize, 5usize);
        let mut compared = 0;
        for cols in [1usize, 7, 16, 37, 64] {
            for q_block_rows in [0usize, 3] {
                let blocks = if q_block_rows == 0 {
                    1
                } else {
                    rows.div_ceil(3)
                };
                for kind in [
                    MergeKind::Linear {
                        fan_in_fan_out: false,
                        magnitude: None,
                    },
                    MergeKind::Linear {
                        fan_in_fan_out: false,
                        magnitude: Some(magnitude_matrix),
                    },
                    MergeKind::Embedding,
                ] {
                    let step = Loaded {
                        kind,
                        rank,
                        p: values(rows * rank, 5),
                        q: values(blocks * rank * cols, 6),
                        q_block_rows,
                        magnitude: values(rows, 7).iter().map(|m| m.abs() + 1.0).collect(),
                        scale: 0.37,
                        rounded_products: false,
                        panels: std::sync::OnceLock::new(),
                    };
                    for dtype in [DType::BF16, DType::F16, DType::F32] {
                        let round = |x: f32| match dtype {
                            DType::BF16 => round_bf16(x),
                            DType::F16 => f16::from_f32(x).to_f32(),
                            _ => x,
                        };
                        let start: Vec<f32> =
                            values(rows * cols, 8).into_iter().map(round).collect();
                        let mut one_by_one = start.clone();
                        let mut delta = vec![0f32; cols];
                        for (i, w) in one_by_one.chunks_exact_mut(cols).enumerate() {
                            apply_with(&step, i, w, &mut delta, round);
                        }
                        let mut together = start.clone();
                        let mut scratch = vec![0f32; ROWS * cols];
                        apply_rows(&step, (0, cols), &mut together, &mut scratch, dtype);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&together),
                            bits(&one_by_one),
                            "{cols} columns, blocks of {q_block_rows}, {dtype:?}"
                        );
                        assert_ne!(bits(&together), bits(&start), "the merge changed nothing");
                        compared += 1;
                    }
                }
            }
        }
        assert_eq!(compared, 5 * 2 * 3 * 3);
    }

    /// A tensor holding every expert reads each row's factors from its own expert:
    /// the same delta as the per-expert tensors, stacked.
    #[test]
    fn every_expert_in_one_tensor_is_the_per_expert_tensors_stacked() {
        let (experts, out, r, inp) = (3usize, 4usize, 2usize, 5usize);
        let lora_a = values(r * experts * inp, 3);
        let lora_b = values(out * r * experts, 4);
        let loaded = |factors: (Vec<f32>, Vec<f32>, usize)| Loaded {
            kind: MergeKind::Linear {
                fan_in_fan_out: false,
                magnitude: None,
            },
            rank: r,
            p: factors.0,
            q: factors.1,
            q_block_rows: factors.2,
            magnitude: Vec::new(),
            scale: 1.0,
            rounded_products: false,
            panels: std::sync::OnceLock::new(),
        };
        let all = loaded(
            expert_factors(
                &lora_a,
                &lora_b,
                (experts * out, inp, r),
                (None, experts as u64, 0),
            )
            .expect("fits"),
        );
        let mut stacked = vec![0f32; inp];
        let mut alone = vec![0f32; inp];
        for e in 0..experts {
            let one = loaded(
                expert_factors(
                    &lora_a,
                    &lora_b,
                    (out, inp, r),
                    (Some(e as u64), experts as u64, 0),
                )
                .expect("fits"),
            );
            for o in 0..out {
                row_delta(&all, e * out + o, &mut stacked);
                row_delta(&one, o, &mut alone);
                assert_eq!(stacked, alone, "expert {e}, row {o}");
                // And the definition: Σ_k B[o][k·E+e]·A[e·r+k].
                for j in 0..inp {
                    let want: f32 = (0..r)
                        .map(|k| {
                            lora_b[o * r * experts + k * experts + e]
                                * lora_a[(e * r + k) * inp + j]
                        })
                        .sum();
                    assert!(
                        (alone[j] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{} vs {want}",
                        alone[j]
                    );
                }
            }
        }
    }
}
