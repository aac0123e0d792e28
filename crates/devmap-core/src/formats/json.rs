//! JSON helpers shared by the readers: objects whose duplicate keys are an error
//! rather than silently collapsed, and Python-compatible pretty printing.

use std::fmt;
use std::io;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

/// A JSON object read with its keys in file order and duplicates kept, so a reader can
/// refuse them by name. (`serde_json::Map` keeps only the last of a duplicate.) The
/// values are `V`: any JSON by default, or a reader's own type.
#[derive(Debug)]
pub struct OrderedObject<V = Value>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedObject<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for ObjectVisitor<V> {
            type Value = OrderedObject<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OrderedObject<V>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((key, value)) = map.next_entry::<String, V>()? {
                    entries.push((key, value));
                }
                Ok(OrderedObject(entries))
            }
        }
        deserializer.deserialize_map(ObjectVisitor(std::marker::PhantomData))
    }
}

impl<V> OrderedObject<V> {
    /// The first key that appears twice, if any.
    pub fn first_duplicate(&self) -> Option<&str> {
        let mut seen = std::collections::HashSet::with_capacity(self.0.len());
        self.0
            .iter()
            .map(|(k, _)| k.as_str())
            .find(|k| !seen.insert(*k))
    }
}

/// Serialises like Python's `json.dumps(value, indent=2)`: two-space indent, `": "`
/// and `","` separators, non-ASCII escaped as `\uXXXX`. Key order is the value's own:
/// pass `BTreeMap`s where Python would use `sort_keys=True`.
pub fn to_python_pretty<T: serde::Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    let formatter = AsciiPretty {
        inner: serde_json::ser::PrettyFormatter::with_indent(b"  "),
    };
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Writing a `Value` into a Vec cannot fail: every key is a string and there is
    // no I/O error to hit.
    if value.serialize(&mut serializer).is_err() {
        return String::new();
    }
    // The formatter writes ASCII only.
    String::from_utf8(out).unwrap_or_default()
}

struct AsciiPretty<'a> {
    inner: serde_json::ser::PrettyFormatter<'a>,
}

impl serde_json::ser::Formatter for AsciiPretty<'_> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        for ch in fragment.chars() {
            if ch.is_ascii() {
                writer.write_all(&[ch as u8])?;
            } else {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.inner.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.inner.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.inner.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_seen() {
        let obj: OrderedObject =
            serde_json::from_str(r#"{"a": 1, "b": 2, "a": 3}"#).expect("parse");
        assert_eq!(obj.0.len(), 3);
        assert_eq!(obj.first_duplicate(), Some("a"));
    }

    #[test]
    fn python_style_output() {
        let v: Value =
            serde_json::from_str(r#"{"b": {"y": 1, "x": [1, 2]}, "a": "é"}"#).expect("parse");
        assert_eq!(
            to_python_pretty(&v),
            "{\n  \"a\": \"\\u00e9\",\n  \"b\": {\n    \"x\": [\n      1,\n      2\n    ],\n    \"y\": 1\n  }\n}"
        );
    }
}
