//! Where a tensor lives, and the device-map rule that decides it.

use std::collections::HashMap;
use std::fmt;

use super::names::covers;

/// A tensor's device, as accelerate's `hf_device_map` states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Placement {
    Gpu(u32),
    Mps,
    Cpu,
    Disk,
    Meta,
    /// No device-map entry covers the tensor.
    Unmapped,
}

impl Placement {
    /// Parses a device-map value given as a string (`"cpu"`, `"cuda:1"`, `"disk"`).
    /// Integers are handled by the device-map reader.
    pub fn parse_device(value: &str) -> Option<Placement> {
        match value {
            "cpu" => Some(Placement::Cpu),
            "disk" => Some(Placement::Disk),
            "meta" => Some(Placement::Meta),
            "mps" => Some(Placement::Mps),
            "cuda" => Some(Placement::Gpu(0)),
            _ => {
                let index = value.strip_prefix("cuda:")?;
                if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                index.parse().ok().map(Placement::Gpu)
            }
        }
    }

    /// The value accelerate's `hf_device_map` uses for this device.
    pub fn to_device_map_value(self) -> serde_json::Value {
        match self {
            Placement::Gpu(i) => serde_json::Value::from(i),
            other => serde_json::Value::from(other.to_string()),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Gpu(i) => write!(f, "gpu:{i}"),
            Placement::Mps => f.write_str("mps"),
            Placement::Cpu => f.write_str("cpu"),
            Placement::Disk => f.write_str("disk"),
            Placement::Meta => f.write_str("meta"),
            Placement::Unmapped => f.write_str("unmapped"),
        }
    }
}

/// A device map: module prefixes to devices, in the order the file gave them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceMap {
    entries: Vec<(String, Placement)>,
    lookup: HashMap<String, usize>,
}

/// The entry that placed a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match<'a> {
    pub key: &'a str,
    /// Position of the key in [`DeviceMap::entries`].
    pub index: usize,
    pub placement: Placement,
}

impl DeviceMap {
    /// Builds a map from entries in file order. A later duplicate key replaces an
    /// earlier one, as a JSON object read into a dict does.
    pub fn new(entries: Vec<(String, Placement)>) -> DeviceMap {
        let mut map = DeviceMap::default();
        for (key, placement) in entries {
            map.set(key, placement);
        }
        map
    }

    pub fn entries(&self) -> &[(String, Placement)] {
        &self.entries
    }

    pub fn get(&self, key: &str) -> Option<Placement> {
        self.lookup.get(key).map(|&i| self.entries[i].1)
    }

    /// Sets (or adds) the entry for `key`.
    pub fn set(&mut self, key: String, placement: Placement) {
        match self.lookup.get(&key) {
            Some(&i) => self.entries[i].1 = placement,
            None => {
                self.lookup.insert(key.clone(), self.entries.len());
                self.entries.push((key, placement));
            }
        }
    }

    /// accelerate's rule: strip whole `.component`s from the name until it is a key,
    /// then try `""`. This is the longest whole-component prefix.
    pub fn locate(&self, name: &str) -> Option<Match<'_>> {
        let mut candidate = name;
        loop {
            if let Some(&i) = self.lookup.get(candidate) {
                let (key, placement) = &self.entries[i];
                return Some(Match {
                    key,
                    index: i,
                    placement: *placement,
                });
            }
            if candidate.is_empty() {
                return None;
            }
            candidate = match candidate.rfind('.') {
                Some(dot) => &candidate[..dot],
                None => "",
            };
        }
    }

    /// Keys that are a plain string prefix of `name` without a dot boundary and longer
    /// than the key accelerate matched (`model.layers.1` against `model.layers.10.x`),
    /// whose device differs. transformers 5 matches keys that way and may place the
    /// tensor there instead.
    pub fn string_prefix_traps<'a>(&'a self, name: &str) -> impl Iterator<Item = Match<'a>> {
        let matched = self.locate(name);
        let matched_len = matched.map_or(0, |m| m.key.len());
        let matched_placement = matched.map(|m| m.placement);
        self.entries
            .iter()
            .enumerate()
            .filter(move |(_, (key, placement))| {
                key.len() > matched_len
                    && name.starts_with(key.as_str())
                    && !covers(key, name)
                    && Some(*placement) != matched_placement
            })
            .map(|(index, (key, placement))| Match {
                key,
                index,
                placement: *placement,
            })
    }

    /// The devices the map uses, in display order.
    pub fn devices(&self) -> Vec<Placement> {
        let mut devices: Vec<Placement> = self.entries.iter().map(|(_, p)| *p).collect();
        devices.sort();
        devices.dedup();
        devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, Placement)]) -> DeviceMap {
        DeviceMap::new(entries.iter().map(|(k, p)| ((*k).to_owned(), *p)).collect())
    }

    #[test]
    fn parse_device_values() {
        assert_eq!(Placement::parse_device("cuda:3"), Some(Placement::Gpu(3)));
        assert_eq!(Placement::parse_device("cuda"), Some(Placement::Gpu(0)));
        assert_eq!(Placement::parse_device("disk"), Some(Placement::Disk));
        assert_eq!(Placement::parse_device("cuda:-1"), None);
        assert_eq!(Placement::parse_device("cuda:"), None);
        assert_eq!(Placement::parse_device("tpu"), None);
        assert_eq!(Placement::parse_device("CPU"), None);
    }

    #[test]
    fn longest_whole_component_prefix_wins() {
        let m = map(&[
            ("model.layers.1", Placement::Gpu(1)),
            ("model.layers", Placement::Cpu),
            ("model", Placement::Gpu(0)),
        ]);
        let at = |n: &str| m.locate(n).map(|x| (x.key.to_owned(), x.placement));
        assert_eq!(
            at("model.layers.1.mlp.up_proj.weight"),
            Some(("model.layers.1".into(), Placement::Gpu(1)))
        );
        assert_eq!(
            at("model.layers.10.mlp.up_proj.weight"),
            Some(("model.layers".into(), Placement::Cpu))
        );
        assert_eq!(
            at("model.norm.weight"),
            Some(("model".into(), Placement::Gpu(0)))
        );
        assert_eq!(at("lm_head.weight"), None);
    }

    #[test]
    fn empty_key_covers_the_rest() {
        let m = map(&[("", Placement::Disk), ("lm_head", Placement::Cpu)]);
        assert_eq!(m.locate("x.y").map(|x| x.placement), Some(Placement::Disk));
        assert_eq!(
            m.locate("lm_head.weight").map(|x| x.placement),
            Some(Placement::Cpu)
        );
    }

    #[test]
    fn string_prefix_trap_is_reported() {
        let m = map(&[
            ("model.layers.1", Placement::Gpu(1)),
            ("model.layers", Placement::Cpu),
        ]);
        let traps: Vec<_> = m
            .string_prefix_traps("model.layers.10.mlp.weight")
            .map(|t| t.key.to_owned())
            .collect();
        assert_eq!(traps, vec!["model.layers.1".to_owned()]);
        assert_eq!(
            m.string_prefix_traps("model.layers.1.mlp.weight").count(),
            0
        );
    }
}
