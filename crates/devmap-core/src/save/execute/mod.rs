//! The one place a [`Recipe`] is run. The writer runs each planned tensor's recipe into
//! its place in a shard file; `verify --against` runs the same recipe into a digest.
//! Both go through [`run`], so what a save writes and what verify expects it to have
//! written cannot disagree, and a new recipe is taught here once.
//!
//! The kernels themselves stay in their modules (`copy`, `cast`, `stitch`, `fp8`,
//! `mxfp4`, `lora_kernel`, `stage`); this module picks one for the recipe and the sink.

pub mod packed;
pub mod recipe;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub use recipe::{Make, Quant, Read, Recipe};

use super::copy::{Copier, CopyError, Stop};
use super::stage::StageRef;
use crate::model::checkpoint::{Checkpoint, InputKind, TensorId};
use crate::types::DType;
use crate::types::range::{ByteRange, FileId};

/// Arithmetic recipes (merges, dequantization, quantization) of at least this many
/// source bytes are split among threads when written to a file
/// ([`super::compute::recipe_threads`]); smaller ones run on one.
const PARALLEL_BYTES: u64 = 1 << 20;

/// A reader of a recipe's bytes, handed each chunk in order.
type Feed<'s> = dyn FnMut(&[u8]) -> io::Result<()> + 's;

/// Where a recipe's bytes go.
pub enum Sink<'a> {
    /// Into a file at an offset (a tensor's place in a shard), with `report(n)` after
    /// each `n` bytes. Copies use `copy_file_range` where the kernel can; arithmetic
    /// recipes are split among threads (sharing the cores with every other writer's,
    /// `save::compute`), each part written in place.
    File {
        at: (&'a File, u64),
        report: &'a mut dyn FnMut(u64),
    },
    /// Every byte, in order, to a reader (verify's digest).
    Stream(&'a mut Feed<'a>),
}

/// What a recipe reads from besides its recipe.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub ckpt: &'a Checkpoint,
    /// The tensor the recipe makes.
    pub tensor: TensorId,
    /// The recipe's source file ([`Recipe::source`]'s), opened by the caller, who keeps
    /// files open from tensor to tensor and checks them unchanged. `None` for a tensor
    /// stored in pieces, or one staged from a live model. Every other file (scales,
    /// adapters, pieces) is opened here.
    pub source: Option<&'a File>,
    /// What fills staged sources (a live model's GPU tensors).
    pub stage: Option<&'a StageRef>,
    pub stop: &'a (dyn Stop + Sync),
}

/// A recipe that failed: the error, and the file it was reading when that was not the
/// recipe's source (a piece's, the scales', an adapter's).
#[derive(Debug)]
pub struct Failed {
    pub error: CopyError,
    pub file: Option<FileId>,
}

impl From<CopyError> for Failed {
    fn from(error: CopyError) -> Failed {
        Failed { error, file: None }
    }
}

/// Runs `recipe` for `inputs.tensor` into `sink`, through `copier`'s buffers.
pub fn run(
    recipe: &Recipe,
    inputs: Inputs<'_>,
    copier: &mut Copier,
    sink: Sink<'_>,
) -> Result<(), Failed> {
    let ckpt = inputs.ckpt;
    let stored = ckpt.tensors()[inputs.tensor].dtype;
    let dtypes = (recipe.input_dtype(stored), recipe.output_dtype(stored));
    let cast = (dtypes.0 != dtypes.1).then_some(dtypes);
    let range = match recipe.read {
        Read::Pieces { index, .. } => {
            if recipe.merge || recipe.quant().is_some() {
                return Err(unsupported("a tensor stored in pieces is copied or cast"));
            }
            return stitched(inputs, index, (dtypes, cast), copier, sink);
        }
        Read::Range(range) => range,
    };
    if range.len == 0 {
        // Nothing to read, and accelerate writes no `.dat` for an empty tensor: its
        // source may not exist.
        return Ok(());
    }
    let kind = ckpt.input_kind(range.file);
    if let InputKind::Staged(key) = kind {
        if recipe.merge || recipe.quant().is_some() {
            return Err(unsupported(
                "a staged tensor is copied or cast, not merged or dequantized",
            ));
        }
        return staged(
            (inputs.stage, key),
            range,
            cast,
            (copier, inputs.stop),
            sink,
        );
    }
    let Some(src) = inputs.source else {
        return Err(unsupported("the recipe's source file was not opened"));
    };
    let from = (src, range.offset);
    let stop = inputs.stop;
    match (recipe.make, recipe.merge) {
        (Make::Copy | Make::Cast { .. }, false) => Ok(match sink {
            Sink::File { at, report } => match cast {
                Some(dtypes) => copier.cast(from, at, range.len, dtypes, stop, report),
                None if kind == InputKind::ProcessMemory => {
                    copier.copy_through_buffer(from, at, range.len, stop, report)
                }
                None => copier.copy(from, at, range.len, stop, report),
            },
            Sink::Stream(feed) => copier.stream(from, range.len, cast, stop, feed),
        }?),
        (Make::Copy | Make::Cast { .. }, true) => merged(inputs, (src, range), dtypes, None, sink),
        (Make::Quantize(layout), false) => {
            let input = super::quantize_fp8::Fp8Input {
                name: &ckpt.tensors()[inputs.tensor].name,
                weight: (src, range),
                layout,
            };
            match sink {
                // Both parts read the whole weight (the scales its tiles' maxima, unless
                // the values' recipe made them) and work on every element: every core
                // for a big one.
                Sink::File { at, report } => {
                    let threads = threads_for(range.len);
                    report(super::quantize_fp8::write_in_parallel(
                        input, at, threads, stop,
                    )?);
                }
                sink @ Sink::Stream(_) => {
                    super::quantize_fp8::stream(input, stop, &mut feed_of(sink))?;
                }
            }
            Ok(())
        }
        (Make::Quantize(_), true) => Err(unsupported(
            "a weight quantized on the way out is not merged into",
        )),
        (
            Make::Dequantize {
                quant:
                    Quant::Fp8 {
                        from,
                        scale,
                        blocks,
                    },
                to,
            },
            merge,
        ) => {
            let name = &ckpt.tensors()[inputs.tensor].name;
            let scale_file = open(ckpt, scale.file)?;
            if merge {
                let rows =
                    super::fp8::Fp8Rows::load(name, (&scale_file, scale), blocks, from, range.len)
                        .map_err(|error| Failed {
                            error,
                            file: Some(scale.file),
                        })?;
                return merged(inputs, (src, range), (from, to), Some(&rows), sink);
            }
            let weight = super::fp8::Fp8Weight {
                name,
                source: (src, range),
                scale: (&scale_file, scale),
                blocks,
                dtypes: (from, to),
            };
            computed(
                sink,
                range.len,
                |at, threads| super::fp8::write_in_parallel(weight, at, threads, stop),
                |feed| super::fp8::stream(weight, stop, feed),
            )
        }
        (
            Make::Dequantize {
                quant: Quant::Mxfp4 { scales, layout },
                to,
            },
            merge,
        ) => {
            let scales_file = open(ckpt, scales.file)?;
            let merger = row_merger(inputs, layout.matrix(), merge)?;
            let packed = super::mxfp4::Packed {
                name: &ckpt.tensors()[inputs.tensor].name,
                blocks: (src, range),
                scales: (&scales_file, scales),
                layout,
                merge: merger.as_ref(),
            };
            computed(
                sink,
                range.len,
                |at, threads| super::mxfp4::write_in_parallel(packed, to, at, threads, stop),
                |feed| super::mxfp4::stream(&packed, to, stop, feed),
            )
        }
        (
            Make::Dequantize {
                quant:
                    Quant::PackedInt {
                        scales,
                        zeros,
                        g_idx,
                        layout,
                    },
                to,
            },
            merge,
        ) => {
            let scales_file = open(ckpt, scales.file)?;
            let zeros_file = zeros.map(|z| open(ckpt, z.file)).transpose()?;
            let g_idx_file = g_idx.map(|g| open(ckpt, g.file)).transpose()?;
            let merger = row_merger(inputs, (layout.rows, layout.cols), merge)?;
            let packed = super::packed_int::PackedInt {
                name: &ckpt.tensors()[inputs.tensor].name,
                packed: (src, range),
                scales: (&scales_file, scales),
                zeros: zeros_file.as_ref().zip(zeros),
                g_idx: g_idx_file.as_ref().zip(g_idx),
                layout,
                merge: merger.as_ref(),
            };
            computed(
                sink,
                range.len,
                |at, threads| super::packed_int::write_in_parallel(&packed, to, at, threads, stop),
                |feed| super::packed_int::stream(&packed, to, stop, feed),
            )
        }
        (
            Make::Dequantize {
                quant:
                    Quant::TransposedInt {
                        qzeros,
                        scales,
                        g_idx,
                        layout,
                    },
                to,
            },
            merge,
        ) => {
            let zeros_file = open(ckpt, qzeros.file)?;
            let scales_file = open(ckpt, scales.file)?;
            let g_idx_file = g_idx.map(|g| open(ckpt, g.file)).transpose()?;
            let merger = row_merger(inputs, (layout.outputs, layout.inputs), merge)?;
            let packed = super::gptq::TransposedInt {
                name: &ckpt.tensors()[inputs.tensor].name,
                qweight: (src, range),
                qzeros: (&zeros_file, qzeros),
                scales: (&scales_file, scales),
                g_idx: g_idx_file.as_ref().zip(g_idx),
                layout,
                merge: merger.as_ref(),
            };
            computed(
                sink,
                range.len,
                |at, threads| super::gptq::write_in_parallel(&packed, to, at, threads, stop),
                |feed| super::gptq::stream(&packed, to, stop, feed),
            )
        }
        (
            Make::Dequantize {
                quant:
                    Quant::Nvfp4 {
                        scales,
                        global,
                        layout,
                    },
                to,
            },
            merge,
        ) => {
            let scales_file = open(ckpt, scales.file)?;
            let global_file = open(ckpt, global.file)?;
            let merger = row_merger(inputs, (layout.rows, layout.cols), merge)?;
            let packed = super::nvfp4::Nvfp4 {
                name: &ckpt.tensors()[inputs.tensor].name,
                packed: (src, range),
                scales: (&scales_file, scales),
                global: (&global_file, global),
                layout,
                merge: merger.as_ref(),
            };
            computed(
                sink,
                range.len,
                |at, threads| super::nvfp4::write_in_parallel(&packed, to, at, threads, stop),
                |feed| super::nvfp4::stream(&packed, to, stop, feed),
            )
        }
    }
}

/// The LoRA merges into tensor `inputs.tensor` (`matrix`: rows × columns as the merge
/// sees the dequantized weight), when the recipe merges.
fn row_merger(
    inputs: Inputs<'_>,
    matrix: (u64, u64),
    merge: bool,
) -> Result<Option<super::lora_kernel::RowMerger>, Failed> {
    if !merge {
        return Ok(None);
    }
    let ckpt = inputs.ckpt;
    Ok(Some(super::lora_kernel::RowMerger::load(
        ckpt,
        inputs.tensor,
        matrix,
        &open_io(ckpt),
    )?))
}

/// An arithmetic kernel run into `sink`: into a file in place, on every core for a big
/// source (`parallel(at, threads)` returns the bytes written), or streamed in order.
fn computed(
    sink: Sink<'_>,
    source_len: u64,
    parallel: impl FnOnce((&File, u64), u64) -> Result<u64, CopyError>,
    stream: impl FnOnce(&mut Feed<'_>) -> Result<(), CopyError>,
) -> Result<(), Failed> {
    match sink {
        Sink::File { at, report } => report(parallel(at, threads_for(source_len))?),
        Sink::Stream(feed) => stream(feed)?,
    }
    Ok(())
}

/// A recipe with LoRA merges: the value `src` holds (as `dtypes.0`; an FP8 weight
/// dequantized with `dequant`'s scales first), merged and written as `dtypes.1`.
fn merged(
    inputs: Inputs<'_>,
    (src, range): (&File, ByteRange),
    dtypes: (DType, DType),
    dequant: Option<&super::fp8::Fp8Rows>,
    sink: Sink<'_>,
) -> Result<(), Failed> {
    let open = open_io(inputs.ckpt);
    let input = super::lora_kernel::MergeInput {
        ckpt: inputs.ckpt,
        id: inputs.tensor,
        src: (src, range.offset),
        len: range.len,
        dtypes,
        open: &open,
        cancel: inputs.stop,
        dequant,
    };
    match sink {
        Sink::File { at, report } => {
            let threads = threads_for(range.len) as usize;
            report(super::lora_kernel::write_in_parallel(input, at, threads)?);
        }
        Sink::Stream(feed) => super::lora_kernel::stream(input, feed)?,
    }
    Ok(())
}

/// A tensor stored in pieces, put together (and cast when `cast` says so).
fn stitched(
    inputs: Inputs<'_>,
    index: u32,
    (dtypes, cast): ((DType, DType), Option<(DType, DType)>),
    copier: &mut Copier,
    sink: Sink<'_>,
) -> Result<(), Failed> {
    let ckpt = inputs.ckpt;
    let mut open = |file| open(ckpt, file).map_err(|f| f.error);
    let sink = match sink {
        Sink::File { at, report } => super::stitch::Sink::File { at, dtypes, report },
        Sink::Stream(feed) => super::stitch::Sink::Stream { cast, feed },
    };
    super::stitch::put_together(
        ckpt,
        (inputs.tensor, index),
        &mut open,
        copier,
        sink,
        inputs.stop,
    )
    .map_err(|failed| Failed {
        error: failed.error,
        file: Some(failed.file),
    })
}

/// A staged tensor (a live model's GPU tensor), a filled chunk at a time.
fn staged(
    (stage, key): (Option<&StageRef>, u64),
    range: ByteRange,
    cast: Option<(DType, DType)>,
    (copier, stop): (&mut Copier, &dyn Stop),
    sink: Sink<'_>,
) -> Result<(), Failed> {
    let align = cast.map_or(1, |(from, _)| from.size());
    let span = (range.offset, range.len);
    Ok(match sink {
        Sink::File {
            at: (dst, out),
            report,
        } => {
            super::stage::through_stage(stage, key, span, align, &mut |from, done, n| match cast {
                Some((f, t)) => {
                    let written = done / f.size() * t.size();
                    copier.cast(from, (dst, out + written), n, (f, t), stop, report)
                }
                None => copier.copy_through_buffer(from, (dst, out + done), n, stop, report),
            })
        }
        Sink::Stream(feed) => {
            super::stage::through_stage(stage, key, span, align, &mut |at, _, n| {
                copier.stream(at, n, cast, stop, feed)
            })
        }
    }?)
}

/// Writes the blocks of a tensor this process holds (one rank of a sharded job; the
/// other ranks write the rest) at their places in the tensor's bytes at `at`: each run
/// of each block (`types::pieces::runs`) read where it is, in memory or staged, and
/// copied or cast as `recipe` says, with positioned writes. `recipe` reads the
/// tensor's pieces (`Read::Pieces`); nothing outside the blocks is touched.
pub fn run_held(
    recipe: &Recipe,
    inputs: Inputs<'_>,
    copier: &mut Copier,
    (dst, at): (&File, u64),
    report: &mut dyn FnMut(u64),
) -> Result<(), Failed> {
    held(recipe, inputs, copier, (dst, at), Held::Write(report)).map(|_| ())
}

/// [`run_held`]'s check: the same blocks made again and compared with what `dst` holds
/// at their places. Returns the first differing byte's offset in `dst`, if any.
pub fn check_held(
    recipe: &Recipe,
    inputs: Inputs<'_>,
    copier: &mut Copier,
    (dst, at): (&File, u64),
) -> Result<Option<u64>, Failed> {
    held(recipe, inputs, copier, (dst, at), Held::Compare)
}

/// What [`held`] does with each block's bytes.
enum Held<'r> {
    Write(&'r mut dyn FnMut(u64)),
    Compare,
}

fn held(
    recipe: &Recipe,
    inputs: Inputs<'_>,
    copier: &mut Copier,
    (dst, at): (&File, u64),
    mut how: Held<'_>,
) -> Result<Option<u64>, Failed> {
    let Read::Pieces { index, .. } = recipe.read else {
        return Err(unsupported("a rank writes the pieces of a tensor it holds"));
    };
    if recipe.merge || recipe.quant().is_some() {
        return Err(unsupported("a tensor held in pieces is copied or cast"));
    }
    let ckpt = inputs.ckpt;
    let tensor = &ckpt.tensors()[inputs.tensor];
    let (read, written) = (
        recipe.input_dtype(tensor.dtype).size(),
        recipe.output_dtype(tensor.dtype).size(),
    );
    let pieces = ckpt.pieces(index);
    let mut files: std::collections::HashMap<FileId, File> = std::collections::HashMap::new();
    // Runs counted in elements: the source and the output may differ in width.
    for stretch in crate::types::pieces::runs(&tensor.shape.to_vec(), 1, pieces) {
        let piece = &pieces[stretch.piece];
        let range = ByteRange {
            file: piece.range.file,
            offset: piece.range.offset + (stretch.from - piece.range.offset) * read,
            len: stretch.len * read,
        };
        let source = if let InputKind::Staged(_) = ckpt.input_kind(range.file) {
            None
        } else {
            if let std::collections::hash_map::Entry::Vacant(e) = files.entry(range.file) {
                e.insert(open(ckpt, range.file)?);
            }
            files.get(&range.file)
        };
        let part = Recipe {
            read: Read::Range(range),
            make: recipe.make,
            merge: false,
        };
        let place = at + stretch.to * written;
        let inputs = Inputs { source, ..inputs };
        match &mut how {
            Held::Write(report) => run(
                &part,
                inputs,
                copier,
                Sink::File {
                    at: (dst, place),
                    report: &mut **report,
                },
            )?,
            Held::Compare => {
                let (mut pos, mut differs, mut there) = (place, None, Vec::new());
                let mut feed = |chunk: &[u8]| -> io::Result<()> {
                    there.resize(chunk.len(), 0);
                    dst.read_exact_at(&mut there, pos)?;
                    if differs.is_none()
                        && let Some(i) = there.iter().zip(chunk).position(|(a, b)| a != b)
                    {
                        differs = Some(pos + i as u64);
                    }
                    pos += chunk.len() as u64;
                    Ok(())
                };
                run(&part, inputs, copier, Sink::Stream(&mut feed))?;
                if differs.is_some() {
                    return Ok(differs);
                }
            }
        }
    }
    Ok(None)
}

/// A sink as a stream of chunks: a file sink writes each chunk after the last and
/// reports it.
fn feed_of(sink: Sink<'_>) -> Box<Feed<'_>> {
    match sink {
        Sink::File {
            at: (dst, start),
            report,
        } => {
            let mut written = 0u64;
            Box::new(move |chunk: &[u8]| {
                dst.write_all_at(chunk, start + written)?;
                written += chunk.len() as u64;
                report(chunk.len() as u64);
                Ok(())
            })
        }
        Sink::Stream(feed) => Box::new(feed),
    }
}

/// Threads for an arithmetic recipe of `len` source bytes: the cores (at most eight)
/// for a big one, one for a small one.
fn threads_for(len: u64) -> u64 {
    if len >= PARALLEL_BYTES {
        super::compute::recipe_threads()
    } else {
        1
    }
}

/// Opens a secondary input (scales, an adapter's weights, a piece) by id.
fn open(ckpt: &Checkpoint, file: FileId) -> Result<File, Failed> {
    open_io(ckpt)(file).map_err(|e| Failed {
        error: CopyError::Io(e),
        file: Some(file),
    })
}

/// [`open`] as the kernels take it.
fn open_io(ckpt: &Checkpoint) -> impl Fn(FileId) -> io::Result<File> + Sync + '_ {
    move |file| crate::formats::input::open_regular(ckpt.file_path(file)).map_err(io::Error::other)
}

fn unsupported(what: &str) -> Failed {
    Failed::from(CopyError::Io(io::Error::other(what.to_owned())))
}
