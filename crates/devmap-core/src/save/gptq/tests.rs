//! The kernel on words packed here, GPTQ v1 and v2 and AWQ, one band and many.

use super::*;
use crate::save::copy::Stop;
use std::io::Write;

struct NeverStop;
impl Stop for NeverStop {
    fn stop(&self) -> bool {
        false
    }
}

fn file_of(words: &[u8]) -> Stored {
    let mut f = tempfile::NamedTempFile::new().expect("tmp");
    f.write_all(words).expect("write");
    let range = ByteRange {
        file: 0,
        offset: 0,
        len: words.len() as u64,
    };
    (f, range)
}

/// A stored file and the range its bytes take.
type Stored = (tempfile::NamedTempFile, ByteRange);

/// The weight a [`case`] of this geometry stored, read from its files (its words, zero
/// points and scales; act order's `g_idx`), the scales float16, in `groups_of` groups.
fn weight<'a>(
    [w, z, s]: &'a [Stored; 3],
    g_idx: Option<&'a Stored>,
    (packing, bits): (Packing, u32),
    (inputs, outputs): (usize, usize),
) -> TransposedInt<'a> {
    TransposedInt {
        name: "m.qweight",
        qweight: (w.0.as_file(), w.1),
        qzeros: (z.0.as_file(), z.1),
        scales: (s.0.as_file(), s.1),
        g_idx: g_idx.map(|g| (g.0.as_file(), g.1)),
        layout: TransposedIntLayout {
            inputs: inputs as u64,
            outputs: outputs as u64,
            bits: bits as u8,
            groups: groups_of(inputs) as u64,
            group_size: (inputs / groups_of(inputs)) as u64,
            packing,
            scale_dtype: DType::F16,
        },
        merge: None,
    }
}

fn le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Packs `32 / bits` values into a word, value `k` at `slot(k)`.
fn pack(bits: u32, value: impl Fn(usize) -> u32, slot: impl Fn(usize) -> u32) -> u32 {
    (0..(32 / bits) as usize).fold(0, |w, k| w | value(k) << (bits * slot(k)))
}

/// `inputs` × `outputs`, 4 or 8 `bits`, 2 groups (3 where 16 does not divide `inputs`);
/// codes `(i·3 + o·5) mod 2^bits`; zero points 0 and the largest in group 0's first
/// columns (a v1 word then carries). The stored words and the weight expected,
/// `[out, in]`.
fn case(
    packing: Packing,
    bits: u32,
    (inputs, outputs): (usize, usize),
    act: bool,
) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<f32>) {
    let groups = groups_of(inputs);
    let values = 1usize << bits;
    let per = (32 / bits) as usize;
    let code = move |i: usize, o: usize| ((i * 3 + o * 5) % values) as u32;
    let zero = move |g: usize, o: usize| match (g, o) {
        (0, 0) => 0,
        (0, 1) => values as u32 - 1,
        _ => ((g * 7 + o * 3) % values) as u32,
    };
    let scale = |g: usize, o: usize| half::f16::from_f32(0.01 + ((g * 8 + o) % 97) as f32 * 0.003);
    let v1 = packing == Packing::Gptq { v1: true };
    // Column k of a word of eight: AWQ interleaves them.
    let slot = move |k: usize| match packing {
        Packing::Awq => [0, 4, 1, 5, 2, 6, 3, 7][k % 8],
        Packing::Gptq { .. } => (k % per) as u32,
    };
    let in_turn = |k: usize| k as u32;
    let qweight: Vec<u32> = match packing {
        Packing::Gptq { .. } => (0..inputs / per)
            .flat_map(|r| (0..outputs).map(move |o| pack(bits, |k| code(r * per + k, o), in_turn)))
            .collect(),
        Packing::Awq => (0..inputs)
            .flat_map(|i| (0..outputs / 8).map(move |j| pack(4, |k| code(i, j * 8 + k), slot)))
            .collect(),
    };
    let mask = values as u32 - 1;
    let stored = move |g: usize, o: usize| {
        if v1 {
            zero(g, o).wrapping_sub(1) & mask
        } else {
            zero(g, o)
        }
    };
    let qzeros: Vec<u32> = (0..groups)
        .flat_map(|g| (0..outputs / per).map(move |j| pack(bits, |k| stored(g, j * per + k), slot)))
        .collect();
    let scales: Vec<u8> = (0..groups)
        .flat_map(|g| (0..outputs).map(move |o| scale(g, o)))
        .flat_map(half::f16::to_le_bytes)
        .collect();
    // What GPTQModel reads: v1 words plus one in every value, carries included.
    let carry = if bits == 8 { 0x0101_0101 } else { 0x1111_1111 };
    let read_zero = |g: usize, o: usize| {
        let word = qzeros[g * outputs / per + o / per];
        let word = if v1 { word.wrapping_add(carry) } else { word };
        (word >> (bits * slot(o))) & mask
    };
    let expected: Vec<f32> = (0..outputs)
        .flat_map(|o| {
            (0..inputs).map(move |i| {
                let g = group_of(i, inputs, act);
                let product =
                    (code(i, o) as i32 - read_zero(g, o) as i32) as f32 * scale(g, o).to_f32();
                half::f16::from_f32(product).to_f32()
            })
        })
        .collect();
    (le(&qweight), le(&qzeros), scales, expected)
}

fn groups_of(inputs: usize) -> usize {
    if inputs.is_multiple_of(16) { 2 } else { 3 }
}

/// Input `i`'s group: in order, or (`act`: GPTQ's desc_act, `g_idx` out of order)
/// scattered.
fn group_of(i: usize, inputs: usize, act: bool) -> usize {
    if act {
        (i * 7 + i / 5) % groups_of(inputs)
    } else {
        i / (inputs / groups_of(inputs))
    }
}

#[test]
fn gptq_and_awq_words_unpack_to_the_weight_transposed() {
    // 8 outputs: one band; 1024: several sub-bands and read bands; 1000: a last read
    // band that ends in half a block of GPTQ's rows. Groups of 8 values are
    // computed value by value, groups of 32 through the table. 24 inputs: AWQ's last
    // eight input rows transposed on their own (16 at a time before). 144 inputs: GPTQ's
    // transposition takes whole tiles of 16 packed rows and the rows after them. AWQ's
    // packed rows of 1,024 outputs are read several whole at a time, of 2,048 a band's
    // words at a time (`shared.rs`).
    let packings = [
        Packing::Gptq { v1: true },
        Packing::Gptq { v1: false },
        Packing::Awq,
    ];
    let sizes = [
        (16, 8),
        (16, 1024),
        (24, 1024),
        (64, 8),
        (64, 1024),
        (64, 1000),
        (144, 1000),
        (16, 2048),
    ];
    // GPTQ also with act order (desc_act: each input row's group from g_idx), and at 8
    // bits (four values a word: groups of 4 and 32 values, each computed).
    let cases = packings
        .into_iter()
        .flat_map(|p| [(p, 4, false), (p, 4, true), (p, 8, false), (p, 8, true)])
        .filter(|&(p, bits, act)| p != Packing::Awq || (bits, act) == (4, false))
        .flat_map(|(p, bits, act)| sizes.map(|size| (p, bits, size, act)));
    // Each case twice on a CPU with the vector kernel: 8-bit, and 4-bit act order, made
    // from the words as read (`direct`), then through the band's columns.
    let cases = cases.flat_map(|case| [(case, false), (case, true)]);
    for ((packing, bits, (inputs, outputs), act), columns_only) in cases {
        direct::COLUMNS_ONLY.set(columns_only);
        let (qweight, qzeros, scales, expected) = case(packing, bits, (inputs, outputs), act);
        let files = [&qweight, &qzeros, &scales].map(|bytes| file_of(bytes));
        let g_idx: Vec<u8> = (0..inputs)
            .flat_map(|i| (group_of(i, inputs, act) as i32).to_le_bytes())
            .collect();
        let g_idx = file_of(&g_idx);
        let g_idx = act.then_some(&g_idx);
        let input = weight(&files, g_idx, (packing, bits), (inputs, outputs));
        let mut out = Vec::new();
        stream(&input, DType::F32, &NeverStop, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .expect("dequantized");
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(
            got, expected,
            "{packing:?} {bits} bits {inputs} × {outputs}, act order {act}, columns only {columns_only}"
        );
        // Two-byte outputs (the kernels' other element size): the same values rounded.
        let mut halves = Vec::new();
        stream(&input, DType::BF16, &NeverStop, &mut |b| {
            halves.extend_from_slice(b);
            Ok(())
        })
        .expect("dequantized to bfloat16");
        let want: Vec<u8> = expected
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(
            halves, want,
            "{packing:?} {bits} bits {inputs} × {outputs} in bfloat16"
        );
        // The same bytes from threads writing their bands in place (AWQ's threads
        // handing their rows to whichever is writing), in both sizes.
        for (to, want) in [(DType::F32, &out), (DType::BF16, &halves)] {
            let dst = tempfile::tempfile().expect("tmp");
            write_in_parallel(&input, to, (&dst, 0), 3, &NeverStop).expect("written");
            let mut written = vec![0u8; want.len()];
            crate::save::copy::read_exact_at(&dst, &mut written, 0).expect("read back");
            assert_eq!(
                &written, want,
                "{packing:?} {bits} bits × {outputs} in parallel, {to:?}"
            );
        }
    }
    // v1's carry: zero point 0 is stored as 15, whose +1 carries into column 1.
    let (_, qzeros, _, _) = case(Packing::Gptq { v1: true }, 4, (16, 8), false);
    let word = u32::from_le_bytes([qzeros[0], qzeros[1], qzeros[2], qzeros[3]]);
    assert_eq!((word.wrapping_add(0x1111_1111) >> 4) & 0xF, 0);
}

/// A scale that is not finite is refused naming its group and output column, wherever
/// the column falls among the read bands (the scales are widened a group row at a
/// time), alone and from threads; nothing is handed on from a read band holding it.
#[test]
fn a_scale_that_is_not_finite_is_named_by_group_and_column() {
    for packing in [Packing::Gptq { v1: true }, Packing::Awq] {
        for (column, bits) in [(5usize, 0x7E00u16), (700, 0x7C00), (1023, 0xFC00)] {
            let (inputs, outputs) = (64, 1024);
            let (qweight, qzeros, mut scales, _) = case(packing, 4, (inputs, outputs), false);
            let at = (outputs + column) * 2;
            scales[at..at + 2].copy_from_slice(&bits.to_le_bytes());
            let files = [&qweight, &qzeros, &scales].map(|bytes| file_of(bytes));
            let input = weight(&files, None, (packing, 4), (inputs, outputs));
            let value = half::f16::from_bits(bits).to_f32();
            let want = format!("hold {value} at [1, {column}]");
            let mut rows = 0;
            let err = stream(&input, DType::BF16, &NeverStop, &mut |b| {
                rows += b.len() / (inputs * 2);
                Ok(())
            })
            .err()
            .map(|e| format!("{e:?}"))
            .unwrap_or_default();
            assert!(err.contains(&want), "{packing:?} column {column}: {err}");
            assert!(
                rows <= column,
                "{packing:?}: {rows} rows handed on before column {column}'s band was refused"
            );
            let dst = tempfile::tempfile().expect("tmp");
            let err = write_in_parallel(&input, DType::BF16, (&dst, 0), 3, &NeverStop)
                .err()
                .map(|e| format!("{e:?}"))
                .unwrap_or_default();
            assert!(
                err.contains(&want),
                "{packing:?} column {column}, threads: {err}"
            );
        }
    }
}

/// Packed rows transposed into the band's columns move each word to its column, whole
/// tiles of 16 rows by 16 columns (a register transposition on AVX-512) and the rows
/// and columns past them alike.
#[test]
fn packed_rows_transpose_into_columns() {
    for count in [0, 5, 16, 37, 64] {
        for row_words in [1, 7, 16, 37, 64] {
            let words: Vec<[u8; 4]> = (0..count * row_words)
                .map(|k| (k as u32).wrapping_mul(0x9E37_79B9).to_le_bytes())
                .collect();
            let stride = count * 4 + 64;
            let mut columns = vec![0u8; row_words * stride];
            kernels::transpose_into_columns(&words, (row_words, count), (&mut columns, stride));
            for c in 0..row_words {
                for t in 0..count {
                    let got = &columns[c * stride + t * 4..c * stride + t * 4 + 4];
                    assert_eq!(
                        got,
                        words[t * row_words + c],
                        "{count} rows of {row_words}: column {c}, row {t}"
                    );
                }
            }
        }
    }
}
