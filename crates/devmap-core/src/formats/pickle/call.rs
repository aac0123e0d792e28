//! What calling an allowed global builds (`REDUCE`): a tensor, a size, a DTensor's
//! parts, an enum's value. Nothing is ever called.

use super::allow::DEEPSPEED_CLASSES;
use super::{Error, TensorRef, Value, as_dims, as_u64};

/// Calls an allowed global on its arguments: builds the value, calls nothing.
pub(super) fn call(callable: Value, args: Value) -> Result<Value, Error> {
    let Value::Tuple(args) = args else {
        return Err(format!("REDUCE with arguments {args:?}, not a tuple").into());
    };
    match callable {
        Value::Global("OrderedDict") if args.is_empty() => Ok(Value::Dict(Vec::new())),
        Value::Global("_rebuild_tensor_v2") if args.len() >= 4 => {
            let Value::Storage(storage) = &args[0] else {
                return Err(format!("_rebuild_tensor_v2 of {:?}, not a storage", args[0]).into());
            };
            Ok(Value::Tensor(TensorRef {
                storage: storage.clone(),
                offset: as_u64(&args[1], "a storage offset")?,
                shape: as_dims(&args[2], "a size")?,
                stride: as_dims(&args[3], "a stride")?,
            }))
        }
        Value::Global("_rebuild_parameter") if !args.is_empty() => Ok(args[0].clone()),
        // A tensor subclass rebuilt by type (`(func, type, args, state)`): the tensor
        // `func(*args)` gives; the type and its state do not change the data.
        // A DTensor: the arguments of its wrapper (`(cls, dtype, size, stride, offset,
        // layout, device, requires_grad)`) and its state (`_local_tensor`, `_spec`).
        Value::Global("_rebuild_from_type_v2")
            if args.len() == 4 && args[1] == Value::Global("DTensor") =>
        {
            let mut args = args;
            let state = args.swap_remove(3);
            let wrapper = args.swap_remove(2);
            Ok(Value::Object {
                class: "DTensor",
                state: Box::new(Value::Tuple(vec![wrapper, state])),
            })
        }
        Value::Global("_rebuild_from_type_v2") if args.len() == 4 => {
            let mut args = args;
            let inner = args.swap_remove(2);
            call(args.swap_remove(0), inner)
        }
        // An int enum (DeepSpeed's ZeRO stage): its number.
        Value::Global("ZeroStageEnum") => match args.as_slice() {
            [Value::Int(i)] => Ok(Value::Int(*i)),
            _ => Err("a ZeRO stage that is not a number".into()),
        },
        // Another allowed class called on its fields: an object holding them.
        Value::Global(class) if DEEPSPEED_CLASSES.iter().any(|(_, c)| *c == class) => {
            Ok(Value::Object {
                class,
                state: Box::new(Value::Tuple(args)),
            })
        }
        // `.metadata`'s helpers, built as the plain values they stand for.
        Value::Global("Size") => match args.as_slice() {
            [Value::Tuple(dims)] => Ok(Value::Tuple(dims.clone())),
            _ => Err("torch.Size of something other than a tuple".into()),
        },
        Value::Global("device") => match args.as_slice() {
            [Value::Str(device)] | [Value::Str(device), _] => Ok(Value::Str(device.clone())),
            _ => Err("a device that is not a name".into()),
        },
        Value::Global("_get_layout") => match args.as_slice() {
            [Value::Str(layout)] => Ok(Value::Str(layout.clone())),
            _ => Err("a layout that is not a name".into()),
        },
        Value::Global("_MEM_FORMAT_ENCODING") => match args.as_slice() {
            [Value::Int(i)] => Ok(Value::Int(*i)),
            _ => Err("a memory format that is not a number".into()),
        },
        // An enum of Megatron-Core's, by its value.
        Value::Global("MegatronEnum") => match args.as_slice() {
            [v @ (Value::Int(_) | Value::Str(_))] => Ok(v.clone()),
            _ => Err("a Megatron-Core enum whose value is not a number or a name".into()),
        },
        Value::Global("WriteItemType") => match args.as_slice() {
            [Value::Int(i)] => Ok(Value::Int(*i)),
            _ => Err("a write item type that is not a number".into()),
        },
        Value::Global("PosixPath") => {
            let parts: Option<Vec<&str>> = args
                .iter()
                .map(|a| match a {
                    Value::Str(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect();
            let parts = parts.ok_or("a path made of something other than strings")?;
            Ok(Value::Str(parts.join("/").replacen("//", "/", 1)))
        }
        Value::Global(name) => Err(format!("`{name}` called with arguments it never takes").into()),
        other => Err(format!("REDUCE of {other:?}, which is not callable here").into()),
    }
}
