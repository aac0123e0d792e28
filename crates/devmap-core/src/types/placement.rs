//! Where a tensor lives, and the device-map rule that decides it.

use std::collections::HashMap;
use std::fmt;

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
    /// The distinct lengths of the keys, longest first: a name's prefix can only be a
    /// key if its length is one of these, so a lookup hashes at most this many
    /// prefixes, however many components the name has.
    key_lengths: Vec<usize>,
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
        if let Some(&i) = self.lookup.get(&key) {
            self.entries[i].1 = placement;
        } else {
            if let Err(at) = self.key_lengths.binary_search_by(|l| key.len().cmp(l)) {
                self.key_lengths.insert(at, key.len());
            }
            self.lookup.insert(key.clone(), self.entries.len());
            self.entries.push((key, placement));
        }
    }

    /// The device accelerate's `dispatch_model` runs offloaded modules on and keeps
    /// their buffers on (`offload_buffers=False`, transformers' default): the first
    /// GPU (or mps) the map uses, else the CPU. None when accelerate dispatches nothing
    /// (one device, and not the disk).
    pub fn main_device(&self) -> Option<Placement> {
        let mut devices: Vec<Placement> = self.entries.iter().map(|(_, p)| *p).collect();
        devices.sort_unstable();
        devices.dedup();
        if devices.len() < 2 && !devices.contains(&Placement::Disk) {
            return None;
        }
        Some(
            devices
                .into_iter()
                .find(|p| matches!(p, Placement::Gpu(_) | Placement::Mps))
                .unwrap_or(Placement::Cpu),
        )
    }

    /// Where accelerate holds a persistent buffer of a module the map places on
    /// `placement`: an offloaded module's buffers (the disk's; the CPU's when the
    /// main device is a GPU) live on the main device.
    pub fn buffer_placement(&self, placement: Placement) -> Placement {
        let Some(main) = self.main_device() else {
            return placement;
        };
        let offloaded = placement == Placement::Disk
            || (placement == Placement::Cpu && matches!(main, Placement::Gpu(_)));
        if offloaded { main } else { placement }
    }

    /// accelerate's rule: strip whole `.component`s from the name until it is a key,
    /// then try `""`. This is the longest whole-component prefix.
    ///
    /// Only prefixes as long as some key are tried, longest first, so the cost is
    /// linear in the name whatever its number of components.
    pub fn locate(&self, name: &str) -> Option<Match<'_>> {
        let bytes = name.as_bytes();
        for &len in &self.key_lengths {
            // A whole-component prefix: all of the name, the part before a dot, or "".
            let boundary = len == 0 || len == bytes.len() || bytes.get(len) == Some(&b'.');
            if len > bytes.len() || !boundary {
                continue;
            }
            // `len` is at a dot (ASCII) or an end, so it is a char boundary.
            if let Some(&i) = self.lookup.get(&name[..len]) {
                let (key, placement) = &self.entries[i];
                return Some(Match {
                    key,
                    index: i,
                    placement: *placement,
                });
            }
        }
        None
    }

    /// The order transformers 5 tries keys in: most dots first, then longest (its
    /// `expand_device_map`).
    pub fn transformers5_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.entries.len()).collect();
        order.sort_by_key(|&i| {
            let k = &self.entries[i].0;
            std::cmp::Reverse((k.matches('.').count(), k.len()))
        });
        order
    }

    /// transformers 5's matching, ready for many names ([`Transformers5Index::locate`]).
    pub fn transformers5_index(&self) -> Transformers5Index<'_> {
        Transformers5Index::new(self)
    }

    /// The devices the map uses, in display order.
    pub fn devices(&self) -> Vec<Placement> {
        let mut devices: Vec<Placement> = self.entries.iter().map(|(_, p)| *p).collect();
        devices.sort();
        devices.dedup();
        devices
    }
}

/// transformers 5's matching: the entry it places a name by is the first key, in
/// [`DeviceMap::transformers5_order`], that matches the start of the name as an
/// unescaped regular expression (so `.` matches any character and no dot boundary is
/// needed: `model.layers.1` captures `model.layers.10.mlp.weight`); none: it falls
/// back to `""` or cpu. Found here for many names: the keys grouped by their length and the positions of their dots, each group a map
/// from a key's other bytes to its rank in transformers' order. A name is looked up
/// once per group (a few) instead of compared with every key: a planned map of 10,200
/// layer keys against 92,000 names took half a second the linear way.
pub struct Transformers5Index<'m> {
    map: &'m DeviceMap,
    order: Vec<usize>,
    groups: Vec<KeyGroup>,
}

/// Keys of one length with dots at the same positions.
struct KeyGroup {
    len: usize,
    /// The positions that are not dots.
    literal: Vec<usize>,
    /// A key's bytes at those positions → its rank in transformers' order.
    ranks: HashMap<Vec<u8>, usize>,
}

impl<'m> Transformers5Index<'m> {
    fn new(map: &'m DeviceMap) -> Transformers5Index<'m> {
        let order = map.transformers5_order();
        let mut groups: Vec<KeyGroup> = Vec::new();
        for (rank, &i) in order.iter().enumerate() {
            let key = map.entries[i].0.as_bytes();
            let literal: Vec<usize> = (0..key.len()).filter(|&p| key[p] != b'.').collect();
            let bytes: Vec<u8> = literal.iter().map(|&p| key[p]).collect();
            let at = groups
                .iter()
                .position(|g| g.len == key.len() && g.literal == literal)
                .unwrap_or_else(|| {
                    groups.push(KeyGroup {
                        len: key.len(),
                        literal,
                        ranks: HashMap::new(),
                    });
                    groups.len() - 1
                });
            // The first in transformers' order wins (a key given twice keeps its first).
            groups[at].ranks.entry(bytes).or_insert(rank);
        }
        Transformers5Index { map, order, groups }
    }

    /// The entry transformers 5 places `name` by (see [`Transformers5Index`]).
    pub fn locate(&self, name: &str) -> Option<Match<'m>> {
        let n = name.as_bytes();
        let mut best: Option<usize> = None;
        let mut bytes = Vec::new();
        for group in &self.groups {
            if n.len() < group.len {
                continue;
            }
            bytes.clear();
            bytes.extend(group.literal.iter().map(|&p| n[p]));
            if let Some(&rank) = group.ranks.get(&bytes)
                && best.is_none_or(|b| rank < b)
                // A dot matches any byte but a newline.
                && regex_prefix_matches(&self.map.entries[self.order[rank]].0, name)
            {
                best = Some(rank);
            }
        }
        best.map(|rank| {
            let i = self.order[rank];
            let (key, placement) = &self.map.entries[i];
            Match {
                key,
                index: i,
                placement: *placement,
            }
        })
    }
}

/// Whether `key`, read as a regular expression made of name characters and `.`,
/// matches the start of `name`. Keys with other regex syntax never occur in module
/// names; they are compared literally.
fn regex_prefix_matches(key: &str, name: &str) -> bool {
    let (k, n) = (key.as_bytes(), name.as_bytes());
    n.len() >= k.len()
        && k.iter()
            .zip(n)
            .all(|(&a, &b)| (a == b'.' && b != b'\n') || a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers 5's rule as stated, key by key in its order: the reference the
    /// index is held to.
    fn linear<'m>(m: &'m DeviceMap, order: &[usize], name: &str) -> Option<Match<'m>> {
        order.iter().copied().find_map(|i| {
            let (key, placement) = &m.entries[i];
            regex_prefix_matches(key, name).then_some(Match {
                key,
                index: i,
                placement: *placement,
            })
        })
    }

    fn map(entries: &[(&str, Placement)]) -> DeviceMap {
        DeviceMap::new(entries.iter().map(|(k, p)| ((*k).to_owned(), *p)).collect())
    }

    #[test]
    fn offloaded_modules_keep_their_buffers_on_the_main_device() {
        use Placement::{Cpu, Disk, Gpu};
        // CPU and disk: the CPU runs the disk's layers and holds their buffers.
        let m = map(&[("a", Cpu), ("b", Disk)]);
        assert_eq!(m.main_device(), Some(Cpu));
        assert_eq!(m.buffer_placement(Disk), Cpu);
        assert_eq!(m.buffer_placement(Cpu), Cpu);
        // With GPUs the first one is the main device, and the CPU's modules are
        // offloaded too.
        let m = map(&[("a", Gpu(1)), ("b", Gpu(0)), ("c", Cpu), ("d", Disk)]);
        assert_eq!(m.main_device(), Some(Gpu(0)));
        assert_eq!(m.buffer_placement(Disk), Gpu(0));
        assert_eq!(m.buffer_placement(Cpu), Gpu(0));
        assert_eq!(m.buffer_placement(Gpu(1)), Gpu(1));
        // One device: accelerate dispatches nothing; all-disk still dispatches.
        assert_eq!(map(&[("a", Gpu(0))]).main_device(), None);
        assert_eq!(map(&[("", Disk)]).buffer_placement(Disk), Cpu);
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

    /// The index finds what the linear walk finds, over many small maps whose keys and
    /// names share an alphabet with `.` (so dots match other bytes, keys nest and cut
    /// numbers short); the counts show both kinds of match happen.
    #[test]
    fn the_transformers5_index_agrees_with_the_linear_walk() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let alphabet = b"ab1.0.";
        let (mut hits, mut wildcard_hits) = (0, 0);
        for _ in 0..400 {
            let mut entries: Vec<(String, Placement)> = Vec::new();
            for k in 0..=next(8) {
                let len = next(6);
                let key: String = (0..len).map(|_| alphabet[next(6)] as char).collect();
                if entries.iter().all(|(e, _)| *e != key) {
                    entries.push((key, Placement::Gpu(k as u32)));
                }
            }
            let refs: Vec<(&str, Placement)> =
                entries.iter().map(|(k, p)| (k.as_str(), *p)).collect();
            let m = map(&refs);
            let order = m.transformers5_order();
            let index = m.transformers5_index();
            for _ in 0..40 {
                // A key with some bytes changed and more appended, or random bytes.
                let mut name: Vec<u8> = entries[next(entries.len())].0.clone().into_bytes();
                for b in &mut name {
                    if next(4) == 0 {
                        *b = alphabet[next(6)];
                    }
                }
                name.extend((0..next(5)).map(|_| alphabet[next(6)]));
                let name = String::from_utf8(name).expect("ascii");
                let linear = linear(&m, &order, &name);
                assert_eq!(index.locate(&name), linear, "{name} in {entries:?}");
                if let Some(hit) = linear {
                    hits += 1;
                    if !name.starts_with(hit.key) {
                        wildcard_hits += 1;
                    }
                }
            }
        }
        assert!(
            hits > 1000 && wildcard_hits > 100,
            "{hits} hits, {wildcard_hits} by a dot"
        );
    }

    #[test]
    fn string_prefix_trap_is_reported() {
        let m = map(&[
            ("model.layers.1", Placement::Gpu(1)),
            ("model.layers", Placement::Cpu),
        ]);
        let order = m.transformers5_order();
        let index = m.transformers5_index();
        let t5 = |n: &str| {
            let linear = linear(&m, &order, n);
            assert_eq!(index.locate(n), linear, "the index agrees on {n}");
            linear.map(|x| x.key.to_owned())
        };
        assert_eq!(
            t5("model.layers.10.mlp.weight").as_deref(),
            Some("model.layers.1")
        );
        assert_eq!(
            t5("model.layers.1.mlp.weight").as_deref(),
            Some("model.layers.1")
        );
        assert_eq!(
            t5("model.layersX2.w").as_deref(),
            Some("model.layers"),
            "`.` matches any character"
        );
        assert_eq!(t5("lm_head.weight"), None);
    }

    /// accelerate's rule written the obvious way: strip components until a key.
    fn reference_locate(map: &DeviceMap, name: &str) -> Option<usize> {
        let mut candidate = name;
        loop {
            if let Some(i) = map.entries().iter().position(|(k, _)| k == candidate) {
                return Some(i);
            }
            if candidate.is_empty() {
                return None;
            }
            candidate = candidate.rfind('.').map_or("", |dot| &candidate[..dot]);
        }
    }

    proptest::proptest! {
        #[test]
        fn locate_agrees_with_stripping_components(
            keys in proptest::collection::vec("(|[ab]{1,2}(\\.[ab1]{0,2}){0,3})", 0..8),
            names in proptest::collection::vec("[ab]{1,2}(\\.[ab1]{0,2}){0,5}", 1..8),
        ) {
            let map = DeviceMap::new(keys.iter().map(|k| (k.clone(), Placement::Cpu)).collect());
            for name in &names {
                let ours = map.locate(name).map(|m| m.index);
                proptest::prop_assert_eq!(ours, reference_locate(&map, name), "{}", name);
            }
        }
    }
}
