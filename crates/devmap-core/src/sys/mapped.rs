//! Where a range of this process's memory comes from. A tensor transformers loaded as
//! stored is a view of the safetensors file, mapped private: as long as no page of it
//! was written since, its bytes are the file's at the mapped offset (Linux shows a
//! private mapping's unwritten pages from the file itself). Reading such a tensor
//! through `/proc/self/mem` would fault every page of it into this process — resident
//! memory growing by the tensor — where copying it from the file costs no memory but
//! the page cache. The live saver asks [`Mappings::file_behind`] for each tensor and
//! copies the clean ones file to file.
//!
//! Linux only (`/proc/self/maps`, `/proc/self/pagemap`); elsewhere nothing is found and
//! every tensor is read from memory.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// A file mapping of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Region {
    start: u64,
    end: u64,
    /// Offset in the file of the mapping's first byte.
    offset: u64,
    inode: u64,
    path: PathBuf,
}

/// The file mappings of this process, as `/proc/self/maps` listed them when read.
#[derive(Debug, Default)]
pub struct Mappings {
    regions: Vec<Region>,
    pagemap: Option<std::fs::File>,
    page: u64,
}

impl Mappings {
    /// This process's file mappings now; empty where `/proc` is not there.
    pub fn of_this_process() -> Mappings {
        Mappings::of_process(None)
    }

    /// The file mappings of process `pid` (this one when `None`) now: empty where
    /// `/proc` is not there or this process may not read that one's.
    pub fn of_process(pid: Option<u32>) -> Mappings {
        let dir = super::proc::process_dir(pid);
        let text = std::fs::read_to_string(dir.join("maps")).unwrap_or_default();
        Mappings {
            regions: parse_maps(&text),
            pagemap: std::fs::File::open(dir.join("pagemap")).ok(),
            page: rustix::param::page_size() as u64,
        }
    }

    /// The file and offset whose bytes equal memory `address..address + len` now: one
    /// mapping of a regular file (still the same file at that path) holds the whole
    /// range, and no page of it was written since it was mapped (each is either not yet
    /// read in, or still the file's page: `/proc/self/pagemap`'s present, swapped and
    /// file-page bits). None when any of that is not so, or cannot be told.
    pub fn file_behind(&self, address: u64, len: u64) -> Option<(PathBuf, u64)> {
        let end = address.checked_add(len)?;
        if len == 0 {
            return None;
        }
        let i = self.regions.partition_point(|r| r.end <= address);
        let region = self.regions.get(i)?;
        if region.start > address || region.end < end {
            return None;
        }
        let meta = std::fs::metadata(&region.path).ok()?;
        let offset = region.offset + (address - region.start);
        if !meta.is_file()
            || std::os::unix::fs::MetadataExt::ino(&meta) != region.inode
            || meta.len() < offset + len
        {
            return None;
        }
        self.clean(address, end)
            .then(|| (region.path.clone(), offset))
    }

    /// Whether no page of `start..end` was written since it was mapped.
    fn clean(&self, start: u64, end: u64) -> bool {
        const PRESENT: u64 = 1 << 63;
        const SWAPPED: u64 = 1 << 62;
        const FILE_PAGE: u64 = 1 << 61;
        let Some(pagemap) = &self.pagemap else {
            return false;
        };
        let (first, last) = (start / self.page, (end - 1) / self.page);
        let mut buf = vec![0u8; 8 * 4096];
        let mut page = first;
        while page <= last {
            let count = (last - page + 1).min(4096);
            let want = &mut buf[..(count * 8) as usize];
            if pagemap.read_exact_at(want, page * 8).is_err() {
                return false;
            }
            for entry in want.chunks_exact(8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(entry);
                let bits = u64::from_le_bytes(word);
                let unread = bits & (PRESENT | SWAPPED) == 0;
                let files = bits & PRESENT != 0 && bits & FILE_PAGE != 0;
                if !(unread || files) {
                    return false;
                }
            }
            page += count;
        }
        true
    }
}

/// The file mappings in `/proc/PID/maps` text (`start-end perms offset dev inode
/// path`), sorted by address: those with an inode and an absolute path that is not
/// marked deleted.
fn parse_maps(text: &str) -> Vec<Region> {
    let mut regions: Vec<Region> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(6, ' ');
            let (range, _perms, offset, _dev, inode) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            let path = fields.next()?.trim_start();
            let (start, end) = range.split_once('-')?;
            let inode: u64 = inode.parse().ok()?;
            if inode == 0 || !path.starts_with('/') || path.ends_with(" (deleted)") {
                return None;
            }
            Some(Region {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                inode,
                path: PathBuf::from(path),
            })
        })
        .collect();
    regions.sort_by_key(|r| r.start);
    regions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_become_file_regions() {
        let text = "\
7f00a0000000-7f00a0400000 r--p 00001000 fd:01 1234                       /models/m/model.safetensors
7f00b0000000-7f00b0001000 rw-p 00000000 00:00 0 
7f00c0000000-7f00c0002000 r--p 00000000 fd:01 99                         /tmp/gone (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
5600a0000000-5600a0010000 r-xp 00002000 fd:01 77                         /usr/bin/python3.11
";
        let regions = parse_maps(text);
        assert_eq!(regions.len(), 2, "{regions:?}");
        assert_eq!(regions[0].path, PathBuf::from("/usr/bin/python3.11"));
        assert_eq!(
            regions[1],
            Region {
                start: 0x7f00_a000_0000,
                end: 0x7f00_a040_0000,
                offset: 0x1000,
                inode: 1234,
                path: PathBuf::from("/models/m/model.safetensors"),
            }
        );
    }

    /// This test's own machine code is a private mapping of the test binary, never
    /// written: its bytes are the file's at the offset found, and a heap buffer is
    /// behind no file.
    #[test]
    #[cfg(target_os = "linux")]
    fn code_is_found_in_its_file_and_heap_memory_is_not() {
        let mappings = Mappings::of_this_process();
        let address = maps_lines_become_file_regions as fn() as usize as u64;
        let (path, offset) = mappings
            .file_behind(address, 64)
            .expect("the test binary's code is mapped from its file");
        let mut from_file = [0u8; 64];
        std::fs::File::open(&path)
            .and_then(|f| f.read_exact_at(&mut from_file, offset))
            .expect("read the binary");
        let mut from_memory = [0u8; 64];
        std::fs::File::open("/proc/self/mem")
            .and_then(|f| f.read_exact_at(&mut from_memory, address))
            .expect("read this process's memory");
        assert_eq!(from_file, from_memory, "{}", path.display());

        let heap = vec![7u8; 1 << 16];
        assert_eq!(mappings.file_behind(heap.as_ptr() as u64, 1 << 16), None);
    }
}
