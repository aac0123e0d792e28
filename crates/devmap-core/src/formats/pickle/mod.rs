//! A restricted reader for the pickles `torch.save` writes (`data.pkl`): it builds
//! values from the opcodes of protocols 2–4 and understands only the globals a state
//! dict uses (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2` and
//! `_rebuild_parameter`, the typed storage classes named in persistent ids). Any other
//! global is refused by name; nothing is ever called or imported.
//!
//! [`read_as`] with [`Allow::DcpMetadata`] also reads torch.distributed.checkpoint's
//! `.metadata`: its dataclasses (`Metadata`, `TensorStorageMetadata`, …) become
//! [`Value::Object`]s holding the state `BUILD` gives them, and the few globals they
//! use (`torch.Size`, torch's dtypes, the layout and memory-format encodings,
//! `pathlib.PosixPath`) are built as plain values.

mod allow;
mod call;

pub use allow::{Allow, DTYPES, STORAGE_CLASSES};
use allow::{DCP_CLASSES, DEEPSPEED_CLASSES, DTENSOR_CLASSES, allowed, storage_class};
use call::call;

use crate::types::DType;

/// A tensor as the pickle describes it: a view of a storage.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    /// In elements of the storage's dtype.
    pub offset: u64,
    pub shape: Vec<u64>,
    pub stride: Vec<u64>,
}

/// A storage named by a persistent id: its dtype, its key (the member
/// `data/<key>` of the archive) and its length in elements.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    pub dtype: DType,
    pub key: String,
    pub elements: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    /// A dict or an OrderedDict, in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A global the reader allows, not yet called.
    Global(&'static str),
    /// An instance of an allowed class (`NEWOBJ`), with the state `BUILD` gave it
    /// (`None` until then): built as data, its class never imported.
    Object {
        class: &'static str,
        state: Box<Value>,
    },
    /// One of torch's dtypes (`torch.bfloat16`), as `.metadata` names them.
    DType(DType),
    Storage(StorageRef),
    Tensor(TensorRef),
}

/// What went wrong, in words (the caller names the file), and whether the pickle asked
/// for something a state dict never needs (refused for safety) or is merely broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A global outside the few a state dict uses: never imported, never called.
    Forbidden(String),
    /// Anything else: an opcode a state dict does not use, a stack that does not add
    /// up, nesting or copies past the limits.
    Malformed(String),
}

impl Error {
    /// The kind of format error it is: a forbidden global makes the file unsafe.
    pub fn kind(&self) -> super::Kind {
        match self {
            Error::Forbidden(_) => super::Kind::Unsafe,
            Error::Malformed(_) => super::Kind::Malformed,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Forbidden(why) | Error::Malformed(why) => f.write_str(why),
        }
    }
}

impl From<String> for Error {
    fn from(why: String) -> Error {
        Error::Malformed(why)
    }
}

impl From<&str> for Error {
    fn from(why: &str) -> Error {
        Error::Malformed(why.to_owned())
    }
}

/// The most values on the stack or in the memo, so a hostile pickle cannot grow them
/// without bound.
const MAX_VALUES: usize = 1 << 24;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Error> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end =
            end.ok_or_else(|| format!("the pickle ends inside an opcode at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<usize, Error> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_le_bytes([b[0], b[1]])))
    }
    fn u32(&mut self) -> Result<usize, Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    fn line(&mut self) -> Result<String, Error> {
        let rest = &self.bytes[self.at..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("a GLOBAL opcode without its newline")?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.at += n + 1;
        Ok(s)
    }
    fn text(&mut self, n: usize) -> Result<String, Error> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| "a string that is not UTF-8".into())
    }
}

impl Value {
    /// The entry `key` of a dict with string keys (a state dict, a dataclass's fields).
    pub fn get(&self, key: &str) -> Option<&Value> {
        let Value::Dict(items) = self else {
            return None;
        };
        items
            .iter()
            .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
            .map(|(_, v)| v)
    }

    /// A non-negative int.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// A tuple or list of non-negative ints: a shape, a chunk's offsets.
    pub fn dims(&self) -> Option<Vec<u64>> {
        match self {
            Value::Tuple(items) | Value::List(items) => items.iter().map(Value::as_u64).collect(),
            _ => None,
        }
    }
}

fn as_u64(v: &Value, what: &str) -> Result<u64, Error> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(format!("{what} is {other:?}, not a non-negative integer").into()),
    }
}

fn as_dims(v: &Value, what: &str) -> Result<Vec<u64>, Error> {
    match v {
        Value::Tuple(items) => items.iter().map(|i| as_u64(i, what)).collect(),
        other => Err(format!("{what} is {other:?}, not a tuple").into()),
    }
}

/// A persistent id `('storage', torch.XStorage, key, location, elements)`.
fn storage(pid: Value) -> Result<Value, Error> {
    let Value::Tuple(items) = pid else {
        return Err(format!("a persistent id {pid:?}, not a tuple").into());
    };
    match items.as_slice() {
        [
            Value::Str(kind),
            Value::Global(class),
            Value::Str(key),
            _location,
            elements,
        ] if kind == "storage" => {
            let (_, dtype) =
                storage_class(class).ok_or_else(|| format!("storage class `{class}`"))?;
            Ok(Value::Storage(StorageRef {
                dtype,
                key: key.clone(),
                elements: as_u64(elements, "a storage size")?,
            }))
        }
        _ => Err(format!("a persistent id {items:?} that is not a storage").into()),
    }
}

/// How deep values may nest (a state dict is a few levels: dict, tensor arguments,
/// sizes), how many values one memo copy may hold (torch's pickles copy globals,
/// strings and small tuples) and how many all copies may make: a pickle past any is
/// not a state dict, and would otherwise overflow the stack or exhaust memory.
const MAX_DEPTH: u32 = 64;
const MAX_COPY: u64 = 1 << 12;
const MAX_COPIED: u64 = 1 << 26;

/// A value on the reader's stack, with how deep it nests and how many values it holds.
#[derive(Clone)]
struct Item {
    value: Value,
    depth: u32,
    nodes: u64,
    /// The memo slots this very object was put in while on the stack: `BUILD` gives it
    /// its state after that, and a later `BINGET` (a DTensor spec shared by parameters
    /// of one shape) must see the state too.
    memo_slots: Vec<usize>,
}

impl Item {
    fn leaf(value: Value) -> Item {
        Item {
            value,
            depth: 1,
            nodes: 1,
            memo_slots: Vec::new(),
        }
    }

    /// How deep a container of `children` nests, and how many values they hold;
    /// refused past [`MAX_DEPTH`].
    fn measure(children: &[Item]) -> Result<(u32, u64), Error> {
        let depth = 1 + children.iter().map(|c| c.depth).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(format!("values nest deeper than {MAX_DEPTH} levels").into());
        }
        Ok((depth, children.iter().map(|c| c.nodes).sum()))
    }

    /// A container of `children`, built by `make`.
    fn of(children: Vec<Item>, make: impl FnOnce(Vec<Value>) -> Value) -> Result<Item, Error> {
        let (depth, nodes) = Item::measure(&children)?;
        Ok(Item {
            value: make(children.into_iter().map(|c| c.value).collect()),
            depth,
            nodes: 1 + nodes,
            memo_slots: Vec::new(),
        })
    }

    /// This container with `more` added to it by `add`.
    fn grow(
        &mut self,
        more: Vec<Item>,
        add: impl FnOnce(&mut Value, Vec<Value>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let (depth, nodes) = Item::measure(&more)?;
        self.depth = self.depth.max(depth);
        self.nodes += nodes;
        add(&mut self.value, more.into_iter().map(|c| c.value).collect())
    }
}

/// The value on top of the stack, to add to.
fn top(stack: &mut [Item]) -> Result<&mut Item, Error> {
    stack
        .last_mut()
        .ok_or_else(|| "an opcode on an empty stack".into())
}

/// Reads the pickle in `bytes`: the value it ends with. Only a state dict's globals.
pub fn read(bytes: &[u8]) -> Result<Value, Error> {
    read_as(bytes, Allow::StateDict)
}

/// Reads the pickle in `bytes` naming only the globals `allow` allows.
pub fn read_as(bytes: &[u8], allow: Allow) -> Result<Value, Error> {
    let mut r = Reader { bytes, at: 0 };
    let mut stack: Vec<Item> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: std::collections::HashMap<usize, Item> = std::collections::HashMap::new();
    let mut copied = 0u64;
    let pop = |stack: &mut Vec<Item>| -> Result<Item, Error> {
        stack
            .pop()
            .ok_or_else(|| "the pickle's stack ran empty".into())
    };
    let since_mark = |stack: &mut Vec<Item>, marks: &mut Vec<usize>| -> Result<Vec<Item>, Error> {
        let m = marks
            .pop()
            .ok_or("an opcode needs a MARK and there is none")?;
        if m > stack.len() {
            return Err("a MARK above the stack".into());
        }
        Ok(stack.split_off(m))
    };
    loop {
        if stack.len() > MAX_VALUES || memo.len() > MAX_VALUES {
            return Err("the pickle holds more values than a state dict would".into());
        }
        let at = r.at;
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?; // PROTO
            }
            0x95 => {
                r.take(8)?; // FRAME
            }
            b'.' => return pop(&mut stack).map(|i| i.value), // STOP
            b'(' => marks.push(stack.len()),
            b'N' => stack.push(Item::leaf(Value::None)),
            0x88 => stack.push(Item::leaf(Value::Bool(true))),
            0x89 => stack.push(Item::leaf(Value::Bool(false))),
            b'K' => stack.push(Item::leaf(Value::Int(i64::from(r.u8()?)))),
            b'M' => stack.push(Item::leaf(Value::Int(r.u16()? as i64))),
            b'J' => {
                let b = r.take(4)?;
                let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                stack.push(Item::leaf(Value::Int(i64::from(v))));
            }
            0x8a => {
                // LONG1: little-endian two's complement of n bytes.
                let n = usize::from(r.u8()?);
                let b = r.take(n)?;
                if n > 8 {
                    return Err("an integer wider than 64 bits".into());
                }
                let mut v: i64 = 0;
                for (i, byte) in b.iter().enumerate() {
                    v |= i64::from(*byte) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                stack.push(Item::leaf(Value::Int(v)));
            }
            b'G' => {
                let b = r.take(8)?;
                let v = f64::from_be_bytes(b.try_into().map_err(|_| "a float")?);
                stack.push(Item::leaf(Value::Float(v)));
            }
            b'X' => {
                let n = r.u32()?;
                stack.push(Item::leaf(Value::Str(r.text(n)?)));
            }
            0x8c => {
                let n = usize::from(r.u8()?);
                stack.push(Item::leaf(Value::Str(r.text(n)?)));
            }
            b'C' => {
                let n = usize::from(r.u8()?);
                stack.push(Item::leaf(Value::Bytes(r.take(n)?.to_vec())));
            }
            b'B' => {
                let n = r.u32()?;
                stack.push(Item::leaf(Value::Bytes(r.take(n)?.to_vec())));
            }
            b')' => stack.push(Item::leaf(Value::Tuple(Vec::new()))),
            b't' => {
                let items = since_mark(&mut stack, &mut marks)?;
                stack.push(Item::of(items, Value::Tuple)?);
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if stack.len() < n {
                    return Err("a TUPLE opcode with too few values".into());
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Item::of(items, Value::Tuple)?);
            }
            b']' => stack.push(Item::leaf(Value::List(Vec::new()))),
            b'}' => stack.push(Item::leaf(Value::Dict(Vec::new()))),
            b'a' | b'e' => {
                let items = if op == b'a' {
                    vec![pop(&mut stack)?]
                } else {
                    since_mark(&mut stack, &mut marks)?
                };
                top(&mut stack)?.grow(items, |list, items| match list {
                    Value::List(list) => {
                        list.extend(items);
                        Ok(())
                    }
                    _ => Err("APPEND to something that is not a list".into()),
                })?;
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = pop(&mut stack)?;
                    let k = pop(&mut stack)?;
                    vec![k, v]
                } else {
                    since_mark(&mut stack, &mut marks)?
                };
                if items.len() % 2 != 0 {
                    return Err("SETITEMS with a key and no value".into());
                }
                top(&mut stack)?.grow(items, |dict, items| {
                    let Value::Dict(d) = dict else {
                        return Err("SETITEM on something that is not a dict".into());
                    };
                    let mut items = items.into_iter();
                    while let (Some(k), Some(v)) = (items.next(), items.next()) {
                        d.push((k, v));
                    }
                    Ok(())
                })?;
            }
            b'c' | 0x93 => {
                let (module, name) = if op == b'c' {
                    (r.line()?, r.line()?)
                } else {
                    let name = pop(&mut stack)?.value;
                    let module = pop(&mut stack)?.value;
                    let (Value::Str(module), Value::Str(name)) = (module, name) else {
                        return Err("STACK_GLOBAL of values that are not strings".into());
                    };
                    (module, name)
                };
                let g = allowed(allow, &module, &name).ok_or_else(|| {
                    Error::Forbidden(format!("names the global `{module}.{name}`, which a state dict never needs; devmap does not load it"))
                })?;
                let value = match DTYPES.iter().find(|(n, _)| *n == g) {
                    Some(&(_, dtype)) if module == "torch" => Value::DType(dtype),
                    _ => Value::Global(g),
                };
                stack.push(Item::leaf(value));
            }
            b'R' => {
                let args = pop(&mut stack)?;
                let callable = pop(&mut stack)?;
                let nodes = args.nodes + 1;
                let depth = args.depth + 1;
                stack.push(Item {
                    value: call(callable.value, args.value)?,
                    depth,
                    nodes,
                    memo_slots: Vec::new(),
                });
            }
            b'Q' => {
                let pid = pop(&mut stack)?;
                stack.push(Item::leaf(storage(pid.value)?));
            }
            0x81 => {
                // NEWOBJ: an instance of an allowed dataclass, as data.
                let args = pop(&mut stack)?;
                let class = pop(&mut stack)?;
                let (Value::Global(class), Value::Tuple(args)) = (class.value, args.value) else {
                    return Err("NEWOBJ of something that is not an allowed class".into());
                };
                let dataclass = args.is_empty()
                    && (class == "Namespace" || DCP_CLASSES.iter().any(|(_, c)| *c == class));
                // DeepSpeed's and a DTensor spec's (TensorMeta is a named tuple).
                let with_fields = DEEPSPEED_CLASSES.iter().any(|(_, c)| *c == class)
                    || DTENSOR_CLASSES.iter().any(|(_, c)| *c == class);
                if !dataclass && !with_fields {
                    return Err(format!("NEWOBJ of `{class}`, which is no dataclass").into());
                }
                // A named tuple's fields come as NEWOBJ's arguments.
                let state = if args.is_empty() {
                    Value::None
                } else {
                    Value::Tuple(args)
                };
                stack.push(Item::leaf(Value::Object {
                    class,
                    state: Box::new(state),
                }));
            }
            b'b' => {
                // BUILD: a state for the object below: a dataclass's fields; otherwise
                // (an OrderedDict's `_metadata`) kept out of the value, which is all a
                // state dict needs.
                let state = pop(&mut stack)?;
                let object = top(&mut stack).map_err(|_| "BUILD with no object")?;
                if matches!(object.value, Value::Object { .. }) {
                    object.grow(vec![state], |o, mut values| {
                        if let (Value::Object { state, .. }, Some(v)) = (o, values.pop()) {
                            **state = v;
                        }
                        Ok(())
                    })?;
                    for &slot in &object.memo_slots {
                        memo.insert(slot, object.clone());
                    }
                }
            }
            b'q' | b'r' | 0x94 => {
                let i = match op {
                    b'q' => usize::from(r.u8()?),
                    b'r' => r.u32()?,
                    _ => memo.len(),
                };
                let item = top(&mut stack).map_err(|_| "a memo put on an empty stack")?;
                if matches!(item.value, Value::Object { .. }) && item.memo_slots.len() < 4 {
                    item.memo_slots.push(i);
                }
                memo.insert(i, item.clone());
            }
            b'h' | b'j' => {
                let i = if op == b'h' {
                    usize::from(r.u8()?)
                } else {
                    r.u32()?
                };
                let item = memo
                    .get(&i)
                    .cloned()
                    .ok_or_else(|| format!("BINGET of memo {i}, never put"))?;
                copied += item.nodes;
                if item.nodes > MAX_COPY || copied > MAX_COPIED {
                    return Err("memo copies make more values than a state dict holds".into());
                }
                stack.push(item);
            }
            other => {
                return Err(format!(
                    "opcode {other:#04x} at byte {at} is not one a state dict uses"
                )
                .into());
            }
        }
    }
}

#[cfg(test)]
mod tests;
