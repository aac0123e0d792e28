//! AWQ weights made by threads that share one read band. AWQ packs a word along the
//! output columns (`[in, out/8]`), so a band of output rows reads an eighth of a byte
//! a row and input: a 28,672-input weight's 14 MiB band is 1,024 output rows, 512
//! bytes a read, where each read costs what a page-long one nearly does (a system call
//! and a page look-up: 0.9 µs at 512 bytes, 1.3 at 4 KiB here). Two threads each with
//! a band of their own read half as long as one band of both their memory would. So
//! the threads read one band together (each a share of its packed rows), then make
//! its sub-bands together (taking them in turn, each handing its rows to whichever
//! thread is writing: `save::hand_off`), band after band: twice the read length in the
//! same memory, and the memory no longer grows with the threads.

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::band::{Groups, Shared, Work, awq_sub_words, copy_in_lines};
use super::{TransposedInt, TransposedIntLayout, band_rows, make_rows, read_rows_in};
use crate::save::copy::{CopyError, Stop, join_all, line_aligned, read_exact_at, resize_exact};
use crate::save::hand_off::HandOff;
use crate::types::DType;

/// Bands a shared read band holds the memory of (each a thread's `READ_BYTES`).
const SHARED_BANDS: u64 = 2;

/// Spare output buffers a thread brings to the hand-off (each a block of at most
/// `OUTPUT_BYTES`): how far a thread that makes rows can run ahead of the one that
/// writes them. A sub-band starts with its transposition and table, no rows made; with
/// one spare a thread, the writer then often had nothing queued, and a thread with a
/// block ready often waited for the writer (16 ms of a band's 31 ms make, the two
/// threads together). Six a thread took an AWQ save's make phases from 340–359 ms to
/// 273–303 (AMD EPYC VM, instrumented side by side), for 5 MiB, of which reading the
/// scales a group row at a time gave back 2.6 (`read.rs`): the AWQ bench's peak went
/// from 55 to 56–60 MiB.
pub(super) const SPARES_A_THREAD: usize = if cfg!(test) { 2 } else { 6 };

/// A read band's AWQ words laid out for its sub-bands: region `k` (every `region`
/// bytes) holds sub-band `k`'s words of each packed row, `widths[k]` bytes a row.
pub(super) struct Regions<'a> {
    bytes: &'a mut [u8],
    region: usize,
    widths: Vec<usize>,
}

impl Shared {
    /// Makes room for `n` output columns' words of `rows` packed rows, laid out for
    /// the sub-bands (AWQ).
    pub(super) fn awq_regions(
        &mut self,
        layout: TransposedIntLayout,
        n: u64,
        rows: usize,
    ) -> Regions<'_> {
        let band_words = n.div_ceil(layout.per_word()) as usize;
        let sub = awq_sub_words(layout);
        self.words_a_row = band_words;
        let len = rows * band_words * 4;
        self.start = line_aligned(&mut self.packed, len);
        let widths = (0..band_words.div_ceil(sub))
            .map(|k| sub.min(band_words - k * sub) * 4)
            .collect();
        Regions {
            bytes: &mut self.packed[self.start..self.start + len],
            region: sub * 4 * rows,
            widths,
        }
    }
}

impl<'a> Regions<'a> {
    /// The regions' rows cut at `parts` (contiguous ranges of packed rows from the
    /// first, in order): for each part, its rows' bytes in each region.
    pub(super) fn split(self, parts: &[Range<usize>]) -> Vec<Vec<&'a mut [u8]>> {
        let mut out: Vec<Vec<&'a mut [u8]>> = parts.iter().map(|_| Vec::new()).collect();
        let rows: usize = parts.iter().map(|r| r.end - r.start).sum();
        let mut rest = self.bytes;
        for &width in &self.widths {
            let len = self.region.min(rest.len());
            let (region, after) = std::mem::take(&mut rest).split_at_mut(len);
            rest = after;
            let mut region = &mut region[..width * rows];
            for (pieces, part) in out.iter_mut().zip(parts) {
                let (mine, after) =
                    std::mem::take(&mut region).split_at_mut((part.end - part.start) * width);
                pieces.push(mine);
                region = after;
            }
        }
        out
    }
}

/// Packed rows of at most this many bytes are read whole, several at a time, and the
/// band's words taken from them: a read costs a system call and a page look-up (about
/// 0.85 µs here) whatever its length, and the kernel copies a KiB in about 0.1 µs, so
/// a 4 KiB row read whole, sixteen at a time, costs half what its 1 KiB of the band
/// read alone does. Rows longer than this are read a band's words at a time.
/// (The tests' 1,024-output rows are read whole, three at a time, their 2,048-output
/// rows a band's words at a time.)
const WHOLE_ROW_BYTES: u64 = if cfg!(test) { 512 } else { 8 << 10 };

/// Bytes of whole packed rows read at once (several rows of at most
/// [`WHOLE_ROW_BYTES`]): few system calls, and a buffer that stays in the cache.
const WHOLE_ROWS_READ: u64 = if cfg!(test) { 1536 } else { 64 << 10 };

/// Reads output columns `cols` of packed rows `rows` of an AWQ weight, each into `row`
/// first (short rows several whole at a time: [`WHOLE_ROW_BYTES`]), then dealt out to
/// the sub-bands' regions (`pieces`: the rows' bytes in each, [`Regions::split`]).
pub(super) fn read_awq_rows(
    input: &TransposedInt<'_>,
    cols: Range<u64>,
    (rows, mut pieces): (Range<usize>, Vec<&mut [u8]>),
    row: &mut Vec<u8>,
) -> Result<(), CopyError> {
    let layout = input.layout;
    let p = layout.per_word();
    let (row_words, first_word) = (layout.outputs / p, cols.start / p);
    let band_words = (cols.end - cols.start).div_ceil(p) as usize;
    let sub = awq_sub_words(layout);
    let row_bytes = row_words * 4;
    // Rows read at once, the bytes read of each, where a read starts in its first
    // packed row, and where the band's words start in each row read.
    let whole = row_bytes <= WHOLE_ROW_BYTES || band_words as u64 == row_words;
    let (at_once, read_bytes, read_from, band_at) = if whole {
        let at_once = (WHOLE_ROWS_READ / row_bytes).max(1) as usize;
        (at_once, row_bytes as usize, 0, first_word as usize * 4)
    } else {
        (1, band_words * 4, first_word * 4, 0)
    };
    resize_exact(row, at_once * read_bytes, 0);
    for r0 in rows.clone().step_by(at_once) {
        let count = at_once.min(rows.end - r0);
        let read = &mut row[..count * read_bytes];
        let at = input.qweight.1.offset + r0 as u64 * row_bytes + read_from;
        read_exact_at(input.qweight.0, read, at)?;
        for (t, row_read) in read.chunks_exact(read_bytes).enumerate() {
            let words = &row_read[band_at..band_at + band_words * 4];
            let local = r0 + t - rows.start;
            for (words, piece) in words.chunks(sub * 4).zip(pieces.iter_mut()) {
                let to = local * words.len();
                copy_in_lines(&mut piece[to..to + words.len()], words);
            }
        }
    }
    Ok(())
}

/// An AWQ weight written by `threads` threads sharing each read band (see the module's
/// note), its rows at their place in `dst` from `dst_offset` on.
pub(super) fn write_awq(
    input: &TransposedInt<'_>,
    groups: &Groups,
    to: DType,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<(), CopyError> {
    // The threads' permits are taken together for as long as the band lives, so no
    // more bands live at once than the cores hold threads for (two jobs on two cores:
    // one band, the second job's weight waiting); the band is kept for the next weight.
    let permits = crate::save::compute::permits();
    permits.run_holding(threads, || {
        crate::save::compute::with_scratch(|kept: &mut SharedBand| {
            write_awq_with(
                kept,
                input,
                (groups, to),
                (dst, dst_offset),
                threads,
                cancel,
            )
        })
    })
}

/// A shared read band, its threads' buffers and the spare output buffers of their
/// hand-offs ([`SPARES_A_THREAD`] a thread), kept between weights.
#[derive(Default)]
struct SharedBand {
    shared: Shared,
    works: Vec<Work>,
    spares: Vec<Vec<u8>>,
}

/// [`write_awq`] in the kept band.
fn write_awq_with(
    kept: &mut SharedBand,
    input: &TransposedInt<'_>,
    (groups, to): (&Groups, DType),
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<(), CopyError> {
    let layout = input.layout;
    let threads = threads.max(1) as usize;
    let read_step = read_rows_in(layout, SHARED_BANDS * super::READ_BYTES);
    let step = band_rows(layout);
    let row_bytes = layout.inputs * to.size();
    let SharedBand {
        shared,
        works,
        spares,
    } = kept;
    works.resize_with(threads, Work::default);
    spares.resize_with(threads * SPARES_A_THREAD, Vec::new);
    let rows = layout.inputs as usize;
    let per = rows.div_ceil(threads);
    let parts: Vec<Range<usize>> = (0..threads)
        .map(|t| (t * per).min(rows)..((t + 1) * per).min(rows))
        .collect();
    let mut r0 = 0;
    while r0 < layout.outputs {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let cols = r0..(r0 + read_step).min(layout.outputs);
        // The zero points and scales, by this thread before the rows (read by one
        // thread beside its share of the rows, they made the save slower).
        shared.params.read(input, cols.clone())?;
        // Each thread reads its share of the packed rows.
        let pieces = shared
            .awq_regions(layout, cols.end - cols.start, rows)
            .split(&parts);
        let reads = pieces.into_iter().zip(&parts).zip(works.iter_mut());
        join_all(reads.map(|((pieces, part), work)| {
            let cols = cols.clone();
            move || read_awq_rows(input, cols, (part.clone(), pieces), &mut work.row)
        }))?;
        // The threads take the sub-bands one at a time, and hand their rows to
        // whichever of them is writing (`hand_off.rs`): neither waits on the other's
        // writes, and neither idles at the end while the other finishes a share.
        let subs = (cols.end - cols.start).div_ceil(step);
        let next = AtomicU64::new(0);
        let hand_off = HandOff::new(dst, std::mem::take(spares));
        let shared = &*shared;
        let made = join_all(works.iter_mut().map(|work| {
            let (cols, next, hand_off) = (cols.clone(), &next, &hand_off);
            move || {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= subs {
                        break;
                    }
                    let first = cols.start + k * step;
                    let mine = (cols.start, first..(first + step).min(cols.end));
                    make_rows(
                        (work, shared),
                        input,
                        groups,
                        mine,
                        to,
                        cancel,
                        &mut |at, made| {
                            let offset = dst_offset + at * row_bytes;
                            hand_off.hand(offset, made.buffer, made.range)
                        },
                    )?;
                }
                hand_off.flush().map_err(CopyError::Io)
            }
        }));
        *spares = hand_off.into_buffers();
        made?;
        r0 = cols.end;
    }
    Ok(())
}
