//! Which globals a pickle may name, by what it is read as ([`Allow`]): torch's
//! storage classes and dtypes, DeepSpeed's and DCP's classes, each mapped to the one
//! value devmap builds for it. Nothing else is ever resolved.

use crate::types::DType;

/// torch's typed storage classes (`torch.BFloat16Storage`) and their dtypes.
pub const STORAGE_CLASSES: [(&str, DType); 10] = [
    ("FloatStorage", DType::F32),
    ("DoubleStorage", DType::F64),
    ("HalfStorage", DType::F16),
    ("BFloat16Storage", DType::BF16),
    ("LongStorage", DType::I64),
    ("IntStorage", DType::I32),
    ("ShortStorage", DType::I16),
    ("CharStorage", DType::I8),
    ("ByteStorage", DType::U8),
    ("BoolStorage", DType::Bool),
];

/// A typed storage class by name, as the table spells it, with its dtype.
pub(super) fn storage_class(name: &str) -> Option<(&'static str, DType)> {
    STORAGE_CLASSES
        .iter()
        .copied()
        .find(|(class, _)| *class == name)
}

/// Which globals a pickle may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    /// A state dict's (`torch.save`'s `data.pkl`).
    StateDict,
    /// A state dict's and those of torch.distributed.checkpoint's `.metadata`.
    DcpMetadata,
    /// A state dict's and those of DeepSpeed's checkpoint files (`*_model_states.pt`,
    /// `*_optim_states.pt`): `torch.Size`, a parameter's rebuild by type, and the few
    /// DeepSpeed classes those pickles name (`DEEPSPEED_CLASSES`), built as data.
    DeepSpeed,
    /// A state dict's and those of Megatron-Core's `common.pt`: the training run's
    /// `argparse.Namespace` of arguments, torch's dtypes, and Megatron-Core's enums
    /// (`megatron.core.….enums.AttnBackend(5)`), each built as data.
    MegatronCommon,
    /// A state dict's whose tensors are DTensors (`torch.distributed.tensor`), as each
    /// rank of an FSDP2 job saves its `model.state_dict()` (verl's
    /// `model_world_size_N_rank_K.pt`): a DTensor's rebuild by type, its local tensor,
    /// and the dataclasses of its spec (`DTENSOR_CLASSES`), built as data.
    DTensor,
}

/// The classes a pickled DTensor names besides torch's dtypes and sizes, by module:
/// the DTensor itself, its spec (device mesh, placements, global shape), built as data.
pub(super) const DTENSOR_CLASSES: [(&str, &str); 10] = [
    ("torch.distributed.tensor", "DTensor"),
    ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
    ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
    ("torch.distributed.device_mesh", "DeviceMesh"),
    ("torch.distributed._mesh_layout", "_MeshLayout"),
    ("torch.distributed._mesh_layout", "_FlatLayout"),
    ("torch.distributed.tensor.placement_types", "Shard"),
    ("torch.distributed.tensor.placement_types", "Replicate"),
    ("torch.distributed.tensor.placement_types", "_StridedShard"),
];

/// The DeepSpeed classes its checkpoints pickle, by module: the loss scaler's state,
/// the ZeRO stage (an int enum) and a parameter's place in a flat group.
pub(super) const DEEPSPEED_CLASSES: [(&str, &str); 4] = [
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
];

/// torch's dtypes by their global name, as `.metadata` names them.
pub const DTYPES: [(&str, DType); 12] = [
    ("float32", DType::F32),
    ("float64", DType::F64),
    ("float16", DType::F16),
    ("bfloat16", DType::BF16),
    ("int64", DType::I64),
    ("int32", DType::I32),
    ("int16", DType::I16),
    ("int8", DType::I8),
    ("uint8", DType::U8),
    ("bool", DType::Bool),
    ("float8_e4m3fn", DType::F8E4M3),
    ("float8_e5m2", DType::F8E5M2),
];

/// The dataclasses of torch.distributed.checkpoint's `.metadata`, by module. The
/// planner's are there because Megatron-Core's saver keeps every rank's save plan in
/// it (`all_local_plans`), which devmap reads past.
pub(super) const DCP_CLASSES: [(&str, &str); 11] = [
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    (
        "torch.distributed.checkpoint.metadata",
        "TensorStorageMetadata",
    ),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    (
        "torch.distributed.checkpoint.metadata",
        "ChunkStorageMetadata",
    ),
    (
        "torch.distributed.checkpoint.metadata",
        "BytesStorageMetadata",
    ),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "SavePlan"),
    ("torch.distributed.checkpoint.planner", "WriteItem"),
    ("torch.distributed.checkpoint.planner", "TensorWriteData"),
];

/// The globals a pickle may name under `allow`, as the reader spells them.
pub(super) fn allowed(allow: Allow, module: &str, name: &str) -> Option<&'static str> {
    let state_dict = match (module, name) {
        ("collections", "OrderedDict") => Some("OrderedDict"),
        ("torch._utils", "_rebuild_tensor_v2") => Some("_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter") => Some("_rebuild_parameter"),
        ("torch", s) => storage_class(s).map(|(c, _)| c),
        _ => None,
    };
    if state_dict.is_some() || allow == Allow::StateDict {
        return state_dict;
    }
    if allow == Allow::MegatronCommon {
        return match (module, name) {
            ("argparse", "Namespace") => Some("Namespace"),
            ("torch", d) => DTYPES.iter().find(|(n, _)| *n == d).map(|(n, _)| *n),
            (m, _) if m.starts_with("megatron.core.") && m.ends_with("enums") => {
                Some("MegatronEnum")
            }
            _ => None,
        };
    }
    if allow == Allow::DTensor {
        if let Some(&(_, class)) = DTENSOR_CLASSES
            .iter()
            .find(|(m, c)| *m == module && *c == name)
        {
            return Some(class);
        }
        return Some(match (module, name) {
            ("torch", "Size") => "Size",
            ("torch", "device") => "device",
            ("torch", d) => DTYPES.iter().find(|(n, _)| *n == d)?.0,
            ("torch._tensor", "_rebuild_from_type_v2") => "_rebuild_from_type_v2",
            ("torch._utils", "_rebuild_wrapper_subclass") => "_rebuild_wrapper_subclass",
            ("torch.serialization", "_get_layout") => "_get_layout",
            _ => return None,
        });
    }
    if allow == Allow::DeepSpeed {
        if let Some(&(_, class)) = DEEPSPEED_CLASSES
            .iter()
            .find(|(m, c)| *m == module && *c == name)
        {
            return Some(class);
        }
        return Some(match (module, name) {
            ("torch", "Size") => "Size",
            ("torch", "Tensor") => "Tensor",
            ("torch._tensor", "_rebuild_from_type_v2") => "_rebuild_from_type_v2",
            _ => return None,
        });
    }
    if let Some(&(_, class)) = DCP_CLASSES.iter().find(|(m, c)| *m == module && *c == name) {
        return Some(class);
    }
    Some(match (module, name) {
        ("torch", "Size") => "Size",
        ("torch", d) => DTYPES.iter().find(|(n, _)| *n == d)?.0,
        ("torch.serialization", "_get_layout") => "_get_layout",
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING") => "_MEM_FORMAT_ENCODING",
        ("torch.distributed.checkpoint.planner", "WriteItemType") => "WriteItemType",
        ("pathlib", "PosixPath") => "PosixPath",
        _ => return None,
    })
}
