//! How each output tensor's bytes are made. The shard planner writes one recipe per
//! tensor; [`super::run`] runs it, into a shard file for the writer and into a digest
//! for `verify --against`, so a value is defined in one place.
//!
//! A recipe says three things, each independent of the others:
//! - what is read ([`Read`]): one byte range of a source, or a tensor stored in pieces
//!   across files (a training run's ranks);
//! - what is done to it ([`Make`]): nothing (copied byte for byte, `copy_file_range`
//!   where the kernel can), a float cast as torch's `.to(dtype)` casts, or a
//!   dequantization with its scales ([`Quant`]: fine-grained FP8, MXFP4 experts);
//! - whether the checkpoint's LoRA merges for the tensor are applied to the result
//!   (`merge`), as peft merges into the model transformers loads.
//!
//! Where the source lives (a file, this process's memory, a live model's staged GPU
//! tensor) is the source file's [`InputKind`](crate::model::checkpoint::InputKind), not
//! the recipe's.

use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::save::fp8::Fp8Blocks;
use crate::save::gptq::TransposedIntLayout;
use crate::save::mxfp4::Mxfp4Layout;
use crate::save::nvfp4::Nvfp4Layout;
use crate::save::packed_int::PackedIntLayout;
use crate::save::quantize_fp8::{Fp8Out, Fp8Part};
use crate::types::DType;
use crate::types::range::ByteRange;

/// One output tensor's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    pub read: Read,
    pub make: Make,
    /// Apply the checkpoint's LoRA merges for this tensor (`Checkpoint::merges_of`) to
    /// what `make` gives, as peft merges them (see `save::lora_kernel`).
    pub merge: bool,
}

/// What a recipe reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// One source range (for a quantized weight, its values; the scales are the
    /// [`Quant`]'s).
    Range(ByteRange),
    /// A tensor stored in pieces across files (`Checkpoint::pieces(index)`, `len` bytes
    /// in all), put together in the whole tensor's order (see `save::stitch`).
    Pieces { index: u32, len: u64 },
}

/// What a recipe does to what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Make {
    /// The stored bytes, unchanged.
    Copy,
    /// The stored elements converted from one floating dtype to another, as torch's
    /// `.to(dtype)` converts them (see `save::cast`).
    Cast { from: DType, to: DType },
    /// A quantized weight multiplied out by its scales, in `to`: the values
    /// transformers computes when it loads the model dequantized.
    Dequantize { quant: Quant, to: DType },
    /// A float weight quantized to fine-grained FP8 as transformers' `Fp8Quantize`
    /// does: its values, or its `_scale_inv` (see `save::quantize_fp8`).
    Quantize(Fp8Out),
}

/// A quantized weight's format and scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    /// FP8 (`from`) with a scale per block (`scale`: the `…_scale_inv` or
    /// `…weight_scale` tensor's bytes; see `save::fp8`).
    Fp8 {
        from: DType,
        scale: ByteRange,
        blocks: Fp8Blocks,
    },
    /// MXFP4 experts (`P_blocks` read, `P_scales` here), transposed per expert as
    /// transformers loads them (see `save::mxfp4`); written under the name `P` and the
    /// shape [`Mxfp4Layout::shape`].
    Mxfp4 {
        scales: ByteRange,
        layout: Mxfp4Layout,
    },
    /// compressed-tensors `pack-quantized` integers (`M.weight_packed` read; its
    /// `weight_scale`, when asymmetric its `weight_zero_point`, and with activation
    /// order its `weight_g_idx` here; see `save::packed_int`), written as `M.weight` of
    /// [`PackedIntLayout::shape`].
    PackedInt {
        scales: ByteRange,
        zeros: Option<ByteRange>,
        g_idx: Option<ByteRange>,
        layout: PackedIntLayout,
    },
    /// compressed-tensors NVFP4 (`M.weight_packed` read; its F8_E4M3 `weight_scale`
    /// per 16 values and its F32 `weight_global_scale` here; see `save::nvfp4`), written
    /// as `M.weight` of [`Nvfp4Layout::shape`].
    Nvfp4 {
        scales: ByteRange,
        global: ByteRange,
        layout: Nvfp4Layout,
    },
    /// GPTQ or AWQ integers (`M.qweight` read; its `qzeros`, `scales` and GPTQ's
    /// `g_idx` here; see `save::gptq`), written as `M.weight` of
    /// [`TransposedIntLayout::shape`].
    TransposedInt {
        qzeros: ByteRange,
        scales: ByteRange,
        g_idx: Option<ByteRange>,
        layout: TransposedIntLayout,
    },
}

impl Recipe {
    /// The stored bytes of `range`, unchanged.
    pub fn copy(range: ByteRange) -> Recipe {
        Recipe {
            read: Read::Range(range),
            make: Make::Copy,
            merge: false,
        }
    }

    /// The elements of `range` cast from `from` to `to`.
    pub fn cast(range: ByteRange, from: DType, to: DType) -> Recipe {
        Recipe {
            read: Read::Range(range),
            make: Make::Cast { from, to },
            merge: false,
        }
    }

    /// The same recipe with the tensor's LoRA merges applied (or not).
    #[must_use]
    pub fn merged(self, merge: bool) -> Recipe {
        Recipe { merge, ..self }
    }

    /// The dtype written, for a tensor stored as `stored`.
    pub fn output_dtype(&self, stored: DType) -> DType {
        match self.make {
            Make::Copy => stored,
            Make::Cast { to, .. } | Make::Dequantize { to, .. } => to,
            Make::Quantize(layout) => layout.dtype(),
        }
    }

    /// The dtype of what is read, for a tensor stored as `stored`.
    pub fn input_dtype(&self, stored: DType) -> DType {
        match self.make {
            Make::Copy => stored,
            Make::Cast { from, .. }
            | Make::Dequantize {
                quant: Quant::Fp8 { from, .. },
                ..
            } => from,
            Make::Dequantize {
                quant: Quant::Mxfp4 { .. } | Quant::Nvfp4 { .. },
                ..
            } => DType::U8,
            Make::Dequantize {
                quant: Quant::PackedInt { .. } | Quant::TransposedInt { .. },
                ..
            } => DType::I32,
            Make::Quantize(layout) => layout.from,
        }
    }

    /// Bytes the recipe writes, for a tensor stored as `stored`.
    pub fn output_len(&self, stored: DType) -> u64 {
        if let Make::Quantize(layout) = self.make {
            return layout.output_len();
        }
        if let Some(shape) = self.renamed_shape() {
            return shape.iter().product::<u64>() * self.output_dtype(stored).size();
        }
        let from = self.input_dtype(stored);
        self.source_len() / from.size() * self.output_dtype(stored).size()
    }

    /// The one source range the recipe streams from (for a quantized weight, its
    /// values); `None` for a tensor stored in pieces.
    pub fn source(&self) -> Option<ByteRange> {
        match self.read {
            Read::Range(range) => Some(range),
            Read::Pieces { .. } => None,
        }
    }

    /// Bytes the recipe reads from its source (or pieces).
    pub fn source_len(&self) -> u64 {
        match self.read {
            Read::Range(range) => range.len,
            Read::Pieces { len, .. } => len,
        }
    }

    /// The pieces the tensor is stored in, when it is.
    pub fn pieces(&self) -> Option<u32> {
        match self.read {
            Read::Pieces { index, .. } => Some(index),
            Read::Range(_) => None,
        }
    }

    /// Every range the recipe streams from: its source, or each of its pieces.
    pub fn ranges(&self, ckpt: &Checkpoint) -> Vec<ByteRange> {
        match self.read {
            Read::Pieces { index, .. } => ckpt.pieces(index).iter().map(|p| p.range).collect(),
            Read::Range(range) => vec![range],
        }
    }

    /// Whether values pass through a float cast (a buffer of converted bytes).
    pub fn casts(&self) -> bool {
        matches!(self.make, Make::Cast { from, to } if from != to)
    }

    /// The quantized format the recipe dequantizes, if it does.
    pub fn quant(&self) -> Option<Quant> {
        match self.make {
            Make::Dequantize { quant, .. } => Some(quant),
            _ => None,
        }
    }

    /// The quantized format the recipe dequantizes, in words (`FP8`, `MXFP4`, …).
    pub fn quant_format(&self) -> Option<&'static str> {
        Some(match self.quant()? {
            Quant::Fp8 { .. } => "FP8",
            Quant::Mxfp4 { .. } => "MXFP4",
            Quant::PackedInt { .. } => "packed integer",
            Quant::Nvfp4 { .. } => "NVFP4",
            Quant::TransposedInt { layout, .. } => match layout.packing {
                crate::save::gptq::Packing::Awq => "AWQ",
                crate::save::gptq::Packing::Gptq { .. } => "GPTQ",
            },
        })
    }

    /// The fixed working memory of a band-streaming dequantizer (bytes, and what it
    /// is, in words), for a recipe that runs one: packed integers and NVFP4. (FP8's
    /// depends on its scales, MXFP4's on its experts: see the save plan.)
    pub fn band_memory(&self) -> Option<(u64, &'static str)> {
        match self.quant()? {
            Quant::PackedInt { .. } => Some((
                crate::save::packed_int::BAND_BYTES,
                "a band of packed rows, their scales and output per computing thread",
            )),
            Quant::Nvfp4 { .. } => Some((
                crate::save::nvfp4::BAND_BYTES,
                "a band of NVFP4 rows, their scales and output per computing thread",
            )),
            Quant::TransposedInt { .. } => Some((
                crate::save::gptq::BAND_BYTES,
                "a band of GPTQ/AWQ output rows, their scales, zero points and output per computing thread",
            )),
            Quant::Fp8 { .. } | Quant::Mxfp4 { .. } => None,
        }
    }

    /// Bytes of the FP8 scales the recipe reads whole, for one that dequantizes FP8.
    pub fn fp8_scales_len(&self) -> Option<u64> {
        match self.quant()? {
            Quant::Fp8 { scale, .. } => Some(scale.len),
            Quant::Mxfp4 { .. }
            | Quant::PackedInt { .. }
            | Quant::Nvfp4 { .. }
            | Quant::TransposedInt { .. } => None,
        }
    }

    /// The name written for a tensor stored as `stored`: its own, but `P` for MXFP4's
    /// `P_blocks` and `M.weight` for a packed `M.weight_packed` written dequantized,
    /// and `M.weight_scale_inv` for the scales of a weight quantized on the way out.
    pub fn written_name<'n>(&self, stored: &'n str) -> std::borrow::Cow<'n, str> {
        use std::borrow::Cow;
        let strip = |suffix: &str| Cow::Borrowed(stored.strip_suffix(suffix).unwrap_or(stored));
        match self.make {
            Make::Dequantize {
                quant: Quant::Mxfp4 { .. },
                ..
            } => strip("_blocks"),
            Make::Dequantize {
                quant: Quant::PackedInt { .. } | Quant::Nvfp4 { .. },
                ..
            } => strip("_packed"),
            Make::Dequantize {
                quant: Quant::TransposedInt { .. },
                ..
            } => Cow::Owned(format!(
                "{}.weight",
                stored.strip_suffix(".qweight").unwrap_or(stored)
            )),
            Make::Quantize(Fp8Out {
                part: Fp8Part::Scales,
                ..
            }) => Cow::Owned(format!("{stored}_scale_inv")),
            _ => Cow::Borrowed(stored),
        }
    }

    /// Whether the recipe writes a second tensor made from its source (the scales of a
    /// weight quantized on the way out), beside the recipe that writes the tensor itself.
    pub fn is_companion(&self) -> bool {
        matches!(
            self.make,
            Make::Quantize(Fp8Out {
                part: Fp8Part::Scales,
                ..
            })
        )
    }

    /// The shape written, for a recipe that writes another shape than the stored
    /// tensor's (a packed or blocked quantized weight).
    pub fn renamed_shape(&self) -> Option<Vec<u64>> {
        if let Make::Quantize(layout) = self.make {
            return Some(layout.shape().to_vec());
        }
        match self.quant()? {
            Quant::Mxfp4 { layout, .. } => Some(layout.shape().to_vec()),
            Quant::PackedInt { layout, .. } => Some(layout.shape().to_vec()),
            Quant::Nvfp4 { layout, .. } => Some(layout.shape().to_vec()),
            Quant::TransposedInt { layout, .. } => Some(layout.shape().to_vec()),
            // Packed FP4 (two values a byte; a matrix, as the planner requires).
            Quant::Fp8 {
                from: DType::I8,
                blocks,
                ..
            } => Some(vec![blocks.rows, blocks.cols]),
            Quant::Fp8 { .. } => None,
        }
    }

    /// The MXFP4 layout, for a recipe that writes MXFP4 experts dequantized (under
    /// another name and shape than the stored tensor's).
    pub fn mxfp4(&self) -> Option<Mxfp4Layout> {
        match self.quant() {
            Some(Quant::Mxfp4 { layout, .. }) => Some(layout),
            _ => None,
        }
    }

    /// Whether several threads may write parts of one shard whose tensors all have
    /// this recipe: copies, casts and FP8 dequantization (each part's weights split
    /// among threads that share the cores' permits, `save::compute`); a merge, an
    /// MXFP4 or a packed integer weight already splits each weight among threads.
    pub fn shares_a_shard(&self) -> bool {
        !self.merge
            && !matches!(
                self.quant(),
                Some(
                    Quant::Mxfp4 { .. }
                        | Quant::PackedInt { .. }
                        | Quant::Nvfp4 { .. }
                        | Quant::TransposedInt { .. }
                )
            )
            && !matches!(
                self.make,
                Make::Quantize(Fp8Out {
                    part: Fp8Part::Values,
                    ..
                })
            )
    }

    /// What the output is, as `verify --against` says its bytes differ from it.
    pub fn what_it_writes(&self) -> String {
        let read = match self.read {
            Read::Range(_) => "the source's",
            Read::Pieces { .. } => "the source's chunks put together,",
        };
        let made = match self.make {
            Make::Copy => format!("{read} bytes"),
            Make::Cast { from, to } => format!("{read} {from} values cast to {to}"),
            Make::Dequantize {
                quant: Quant::Fp8 { from, .. },
                to,
            } => format!("{read} {from} values times their block scales, in {to}"),
            Make::Dequantize {
                quant: Quant::Mxfp4 { .. },
                to,
            } => format!("{read} MXFP4 blocks times their scales, transposed per expert, in {to}"),
            Make::Dequantize {
                quant: Quant::PackedInt { layout, .. },
                to,
            } => format!(
                "{read} packed {}-bit integers less their zero points, times their scales, in {to}",
                layout.bits
            ),
            Make::Dequantize {
                quant: Quant::TransposedInt { layout, .. },
                to,
            } => format!(
                "{read} {}-bit integers unpacked, less their zero points, times their scales, transposed, in {to}",
                layout.bits
            ),
            Make::Dequantize {
                quant: Quant::Nvfp4 { .. },
                to,
            } => {
                format!("{read} FP4 values times their block scales over the global scale, in {to}")
            }
            Make::Quantize(Fp8Out {
                part: Fp8Part::Values,
                ..
            }) => format!("{read} values quantized to FP8 in 128×128 tiles"),
            Make::Quantize(Fp8Out {
                part: Fp8Part::Scales,
                ..
            }) => format!("{read} values' FP8 tile scales"),
        };
        if self.merge {
            format!("{made}, with the LoRA merges applied")
        } else {
            made
        }
    }

    /// Tensor `id`'s recipe as stored in a plan: see [`super::packed`].
    pub(crate) fn pack(self, ckpt: &Checkpoint, id: TensorId) -> super::packed::Packed {
        super::packed::Packed::new(ckpt, id, self)
    }
}
