//! The `--json` schema (documented in docs/guide.md; keep it stable).

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::model::checkpoint::{Checkpoint, Source};
use crate::types::placement::Placement;

#[derive(Serialize)]
struct Report<'a> {
    model: String,
    tensors: Tensors<'a>,
    ties: Vec<Vec<&'a str>>,
    /// What says each group of `ties` is tied, in the same order.
    tie_evidence: Vec<&'static str>,
    devices: Devices,
    total_bytes: u64,
    /// config.json's `quantization_config`: its method and FP8 block, or null.
    quantization: Option<QuantizationOut>,
    warnings: Vec<WarningOut>,
}

#[derive(Serialize)]
struct QuantizationOut {
    method: String,
    /// Fine-grained FP8's `weight_block_size` (rows, columns).
    #[serde(skip_serializing_if = "Option::is_none")]
    block: Option<[u64; 2]>,
}

/// A warning as `--json` reports it: a stable kind, every name it is about, and the
/// sentence the text report prints.
#[derive(Serialize)]
struct WarningOut {
    kind: &'static str,
    names: Vec<String>,
    message: String,
}

#[derive(Serialize)]
struct TensorOut<'a> {
    name: &'a str,
    dtype: &'static str,
    shape: &'a crate::types::shape::Shape,
    /// As stored, in `dtype`.
    bytes: u64,
    /// Where an offload index says the model holds it in another dtype: that dtype,
    /// and its bytes in it (what module sizes and device totals count).
    #[serde(skip_serializing_if = "Option::is_none")]
    loads_as: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    held_bytes: Option<u64>,
    placement: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    map_key: Option<&'a str>,
    /// The name the loaded model has for it, where transformers 5 renames or fuses it
    /// (device maps from a loaded model use this name).
    #[serde(skip_serializing_if = "Option::is_none")]
    loaded_as: Option<String>,
    source: SourceOut<'a>,
    /// LoRA merges a save applies to it (`--merge-lora`), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lora: Vec<LoraOut<'a>>,
    /// Its part in a quantized checkpoint: a quantized weight or the scales of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    quantized: Option<QuantizedOut>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum QuantizedOut {
    Weight {
        format: String,
        scales: String,
        dequantized_name: String,
        dequantized_shape: Vec<u64>,
        /// In the dtype the dequantized model loads in (config.json's, else bfloat16).
        dequantized_bytes: u64,
    },
    Scales {
        scales_of: String,
    },
}

#[derive(Serialize)]
struct LoraOut<'a> {
    adapter: &'a str,
    kind: &'static str,
    rank: u64,
    alpha: f64,
    scale: f32,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum SourceOut<'a> {
    Safetensors {
        file: String,
        offset: u64,
    },
    /// A state dict `torch.save` wrote (`pytorch_model.bin`): the offset is in the
    /// archive, where the tensor's bytes start inside its storage member.
    #[serde(rename = "torch_bin")]
    TorchBin {
        file: String,
        offset: u64,
    },
    /// A chunk of a torch.distributed.checkpoint `.distcp` file (a `torch.save`
    /// archive inside it): the offset is in the file.
    Dcp {
        file: String,
        offset: u64,
    },
    /// Blocks saved apart by a training run's ranks, that together make the tensor.
    Pieces {
        chunks: Vec<ChunkOut<'a>>,
    },
    Offload {
        file: String,
        offset: u64,
    },
    Adapter {
        file: String,
        offset: u64,
    },
    Tied {
        to: &'a str,
    },
    None,
}

/// One block of a tensor stored in pieces: where it is, the rank that wrote it (from
/// the file's name), and which part of the tensor it holds.
#[derive(Serialize)]
struct ChunkOut<'a> {
    file: String,
    offset: u64,
    rank: Option<u32>,
    offsets: &'a [u64],
    sizes: &'a [u64],
    /// Elements per step of each dimension in storage, for a view `torch.save` kept
    /// with its strides; absent for a block stored row-major.
    #[serde(skip_serializing_if = "Option::is_none")]
    stride: Option<&'a [u64]>,
}

/// Devices in display order (GPUs by index, then cpu, disk, meta, unmapped).
struct Devices(Vec<(Placement, u64)>);

impl Serialize for Devices {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (p, bytes) in &self.0 {
            map.serialize_entry(&p.to_string(), bytes)?;
        }
        map.end()
    }
}

/// Every tensor, each made into its record only while it is written: a million-tensor
/// report never holds a million records.
struct Tensors<'a>(&'a Checkpoint);

impl Serialize for Tensors<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let ckpt = self.0;
        let mut seq = s.serialize_seq(Some(ckpt.tensors().len()))?;
        for id in 0..ckpt.tensors().len() {
            seq.serialize_element(&tensor_out(ckpt, id))?;
        }
        seq.end()
    }
}

/// The report written to `out` as it is made (pretty JSON, keys in schema order, a
/// newline at the end): memory does not grow with the number of tensors.
pub fn write_json(
    ckpt: &Checkpoint,
    out: &mut (impl std::io::Write + ?Sized),
) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, &report(ckpt)).map_err(std::io::Error::from)?;
    out.write_all(b"\n")
}

pub fn to_json(ckpt: &Checkpoint) -> serde_json::Value {
    serde_json::to_value(report(ckpt)).unwrap_or(serde_json::Value::Null)
}

/// Pretty JSON with the keys in schema order.
pub fn to_json_string(ckpt: &Checkpoint) -> String {
    let mut text = serde_json::to_string_pretty(&report(ckpt)).unwrap_or_default();
    text.push('\n');
    text
}

fn tensor_out(ckpt: &Checkpoint, id: usize) -> TensorOut<'_> {
    let file = |id: usize| ckpt.file_label(id);
    let t = &ckpt.tensors()[id];
    TensorOut {
        name: &t.name,
        dtype: t.dtype.safetensors_name(),
        shape: &t.shape,
        bytes: t.bytes(),
        loads_as: t.load_dtype.map(crate::types::DType::torch_name),
        held_bytes: t.load_dtype.map(|_| t.held_bytes()),
        placement: t.placement.to_string(),
        map_key: ckpt.map_key(t),
        loaded_as: ckpt.loaded_name(id).map(str::to_owned),
        source: match t.source {
            // The file's kind says how to read the offset: in a safetensors file, a
            // `pytorch_model.bin` archive, or a `.distcp` file of chunk archives.
            Source::Checkpoint(r) => {
                let (file, offset) = (file(r.file), r.offset);
                match ckpt.file_path(r.file).extension().and_then(|e| e.to_str()) {
                    Some("bin") => SourceOut::TorchBin { file, offset },
                    Some("distcp") => SourceOut::Dcp { file, offset },
                    _ => SourceOut::Safetensors { file, offset },
                }
            }
            Source::Pieces(index) => SourceOut::Pieces {
                chunks: ckpt
                    .pieces(index)
                    .iter()
                    .map(|p| ChunkOut {
                        file: file(p.range.file),
                        offset: p.range.offset,
                        rank: crate::formats::split::rank_of(ckpt.file_path(p.range.file)),
                        offsets: &p.offsets,
                        sizes: &p.sizes,
                        stride: p.stride.as_deref(),
                    })
                    .collect(),
            },
            Source::Offload(r) => SourceOut::Offload {
                file: file(r.file),
                offset: r.offset,
            },
            Source::Adapter(r) => SourceOut::Adapter {
                file: file(r.file),
                offset: r.offset,
            },
            Source::Tied(to) => SourceOut::Tied {
                to: &ckpt.tensors()[to].name,
            },
            Source::None => SourceOut::None,
        },
        lora: ckpt
            .merges_of(id)
            .iter()
            .map(|m| LoraOut {
                adapter: &m.adapter,
                kind: m.kind_name(),
                rank: m.rank,
                alpha: m.alpha,
                scale: m.scale,
            })
            .collect(),
        quantized: crate::model::quantized::quantized_part(ckpt, id).map(|part| {
            let bytes = part.dequantized_bytes(crate::model::quantized::dequantized_dtype(ckpt));
            match part {
                crate::model::quantized::QuantizedPart::Weight {
                    format,
                    scales,
                    dequantized_name,
                    dequantized_shape,
                } => QuantizedOut::Weight {
                    format,
                    scales,
                    dequantized_name,
                    dequantized_shape,
                    dequantized_bytes: bytes,
                },
                crate::model::quantized::QuantizedPart::Scales { of } => {
                    QuantizedOut::Scales { scales_of: of }
                }
            }
        }),
    }
}

fn report(ckpt: &Checkpoint) -> Report<'_> {
    Report {
        model: ckpt
            .remote
            .as_ref()
            .map_or_else(|| ckpt.dir.display().to_string(), |r| r.name.clone()),
        tensors: Tensors(ckpt),
        ties: ckpt
            .ties
            .iter()
            .map(|g| {
                g.members
                    .iter()
                    .map(|&m| ckpt.tensors()[m].name.as_ref())
                    .collect()
            })
            .collect(),
        tie_evidence: ckpt.ties.iter().map(|g| g.evidence.label()).collect(),
        devices: Devices(ckpt.device_totals()),
        total_bytes: ckpt.total_bytes(),
        quantization: ckpt.config.quantization.as_ref().map(|q| QuantizationOut {
            method: q.method.clone(),
            block: (q.method == "fp8").then_some([q.block.0, q.block.1]),
        }),
        warnings: crate::model::checks::all_warnings(ckpt)
            .iter()
            .map(|w| WarningOut {
                kind: w.kind(),
                names: w.names(),
                message: w.to_string(),
            })
            .collect(),
    }
}
