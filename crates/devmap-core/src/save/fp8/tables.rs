//! Output tables for the fine-grained FP8 and packed FP4 dequantizers: every output a
//! block's stored values can have (256 for an FP8 byte, 16 for an FP4 code), made with
//! the streamed path's own multiply, rounding and cast, then a lookup a value.

use super::{E2M1, Fp8Rows, row_bytes, rows, table};
use crate::types::DType;

impl Fp8Rows {
    /// `out` = each of `codes`' values times `s`, as [`Fp8Rows::values`] computes it
    /// and converted to `to` by the same cast as the streamed path: an output table.
    fn outputs(&self, codes: &[f32], s: f32, to: DType, out: &mut [u8]) {
        let mut products: Vec<f32> = codes.iter().map(|v| v * s).collect();
        self.round_products(&mut products);
        let bytes: Vec<u8> = products.iter().flat_map(|p| p.to_le_bytes()).collect();
        if to == DType::F32 {
            out.copy_from_slice(&bytes);
        } else {
            crate::save::cast::cast(DType::F32, to, &bytes, out);
        }
    }

    /// FP8 rows (the first is row `first`) dequantized straight into `to`'s bytes in
    /// `out`, each value looked up in its block's table of the 256 outputs a byte can
    /// have (made as the streamed path computes them); `tables` holds a row of blocks' tables, remade when
    /// the rows reach the next row of blocks.
    pub fn fp8_into(
        &self,
        first: u64,
        input: &[u8],
        to: DType,
        tables: &mut Fp8Tables,
        out: &mut [u8],
    ) {
        match to.size() {
            2 => self.fp8_lookup::<2>(first, input, to, tables, out),
            _ => self.fp8_lookup::<4>(first, input, to, tables, out),
        }
    }

    fn fp8_lookup<const SIZE: usize>(
        &self,
        first: u64,
        input: &[u8],
        to: DType,
        tables: &mut Fp8Tables,
        out: &mut [u8],
    ) {
        if self.blocks.scale_dtype == DType::F8E8M0 {
            return self.fp8_by_exponent::<SIZE>(first, input, to, tables, out);
        }
        if self.blocks.block_rows * self.blocks.block_cols < 1024 {
            return self.fp8_computed::<SIZE>(first, input, to, out);
        }
        let blocks = self.blocks;
        let sc = blocks.grid().1;
        let cols = blocks.cols as usize;
        let bc = blocks.block_cols as usize;
        let lut = table(self.from);
        for (r, row, out_row) in rows(first, (input, cols), (out, cols * SIZE)) {
            let at = self.scale_at(r);
            if tables.scale_row != Some(at) {
                tables.bytes.resize(sc as usize * 256 * SIZE, 0);
                for (b, t) in tables.bytes.chunks_exact_mut(256 * SIZE).enumerate() {
                    self.outputs(lut, self.scales[at + b], to, t);
                }
                tables.scale_row = Some(at);
            }
            for ((values, dst), t) in row
                .chunks(bc)
                .zip(out_row.chunks_mut(bc * SIZE))
                .zip(tables.bytes.chunks_exact(256 * SIZE))
            {
                look_up::<SIZE>(values, t, dst);
            }
        }
    }
}

/// Each of `codes` looked up in `table` (its 256 outputs of `SIZE` bytes) into `dst`.
fn look_up<const SIZE: usize>(codes: &[u8], table: &[u8], dst: &mut [u8]) {
    let (table, _) = table.as_chunks::<SIZE>();
    for (&c, o) in codes.iter().zip(dst.as_chunks_mut::<SIZE>().0) {
        *o = table[usize::from(c)];
    }
}

impl Fp8Rows {
    /// [`Fp8Rows::fp8_into`] for E8M0 scales (MXFP8: a power of two per 32 values of a
    /// row): the 256 outputs of a scale made once, when its exponent is first met, and
    /// kept for every block that has it. A row of blocks' own tables would be 256
    /// outputs made for each 32 values, remade every row.
    fn fp8_by_exponent<const SIZE: usize>(
        &self,
        first: u64,
        input: &[u8],
        to: DType,
        tables: &mut Fp8Tables,
        out: &mut [u8],
    ) {
        let (cols, bc) = (self.blocks.cols as usize, self.blocks.block_cols as usize);
        let lut = table(self.from);
        let make = |s: f32, t: &mut [u8]| self.outputs(lut, s, to, t);
        self.each_block(first, (input, cols, bc), (out, SIZE), |values, dst, s| {
            look_up::<SIZE>(values, tables.by_scale.get(s, 256 * SIZE, make), dst);
        });
    }
}

impl Fp8Rows {
    /// [`Fp8Rows::fp8_into`] for small blocks of a row with float scales
    /// (compressed-tensors' `group` strategy): each block's 256 outputs would be more
    /// than its values, remade every row, so each value is computed as a table entry is
    /// (the code's value times the scale in f32, rounded to the product's dtype,
    /// converted), in one vectorised pass, the codes decoded on their bits. A block
    /// holding a code that is not finite (NaN, E5M2's infinities), or an output other
    /// than bfloat16 and float32, goes through the block's table.
    fn fp8_computed<const SIZE: usize>(&self, first: u64, input: &[u8], to: DType, out: &mut [u8]) {
        let (cols, bc) = (self.blocks.cols as usize, self.blocks.block_cols as usize);
        let lut = table(self.from);
        let format = super::Fp8Bits::of(self.from);
        let mut own = vec![0u8; 256 * SIZE];
        self.each_block(first, (input, cols, bc), (out, SIZE), |codes, dst, s| {
            if let Some(format) = format
                && !format.any_special(codes)
                && crate::save::lookup::dequantize_codes(
                    codes,
                    (format, s),
                    (self.blocks.product, to),
                    dst,
                )
            {
                return;
            }
            self.outputs(lut, s, to, &mut own);
            look_up::<SIZE>(codes, &own, dst);
        });
    }
}

/// An FP8 weight's output tables for one row of blocks (256 outputs a block), and which
/// row of scales they were made for; with E8M0 scales, a table per exponent instead.
#[derive(Default)]
pub struct Fp8Tables {
    scale_row: Option<usize>,
    bytes: Vec<u8>,
    by_scale: ScaleTables,
}

/// A packed FP4 weight's output tables: the sixteen outputs of a block, by its scale.
pub type Fp4Tables = ScaleTables;

/// Output tables by scale. E8M0 scales are powers of two, so a table per exponent (256
/// at most, made when first met) serves every block that has it; any other scale gets
/// its own, kept while blocks repeat it.
#[derive(Default)]
pub struct ScaleTables {
    by_exponent: Vec<Option<Box<[u8]>>>,
    other: Option<(u32, Box<[u8]>)>,
}

impl ScaleTables {
    /// The table of `len` bytes for scale `s`, made by `make` when first needed.
    fn get(&mut self, s: f32, len: usize, make: impl Fn(f32, &mut [u8])) -> &[u8] {
        let table = || {
            let mut table = vec![0u8; len].into_boxed_slice();
            make(s, &mut table);
            table
        };
        let bits = s.to_bits();
        if bits & 0x807F_FFFF == 0 {
            if self.by_exponent.is_empty() {
                self.by_exponent.resize(256, None);
            }
            return self.by_exponent[(bits >> 23) as usize].get_or_insert_with(table);
        }
        if self.other.as_ref().is_some_and(|(b, _)| *b != bits) {
            self.other = None;
        }
        &self.other.get_or_insert_with(|| (bits, table())).1
    }
}

impl Fp8Rows {
    /// Packed FP4 rows (the first is row `first`) dequantized straight into `to`'s
    /// bytes in `out`: each block's sixteen outputs — the E2M1 value times the block's
    /// scale in f32, rounded as [`Fp8Rows::values`] rounds the product, then converted
    /// to `to` — looked up for its bytes (two values a byte, the low nibble first). The
    /// same values as [`Fp8Rows::values`] and a cast: a lookup a value instead of a
    /// multiply, a rounding and a conversion.
    pub fn fp4_into(
        &self,
        first: u64,
        input: &[u8],
        to: DType,
        tables: &mut Fp4Tables,
        out: &mut [u8],
    ) {
        match to.size() {
            2 => self.fp4_expand::<2>(first, input, to, tables, out),
            _ => self.fp4_expand::<4>(first, input, to, tables, out),
        }
    }

    fn fp4_expand<const SIZE: usize>(
        &self,
        first: u64,
        input: &[u8],
        to: DType,
        tables: &mut Fp4Tables,
        out: &mut [u8],
    ) {
        let bc = self.blocks.block_cols as usize;
        let stored = row_bytes(DType::I8, self.blocks.cols) as usize;
        let make = |s: f32, table: &mut [u8]| self.outputs(&E2M1, s, to, table);
        // A block of `bc` values (even) is `bc / 2` bytes.
        self.each_block(
            first,
            (input, stored, bc / 2),
            (out, SIZE),
            |bytes, dst, s| {
                let table = tables.get(s, 16 * SIZE, make);
                let (table, _) = table.as_chunks::<SIZE>();
                if let Ok(table) = <&[[u8; SIZE]; 16]>::try_from(table) {
                    crate::save::lookup::expand_nibbles(bytes, table, dst);
                }
            },
        );
    }
}
