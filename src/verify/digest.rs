//! One tensor's bytes, summed up while they stream past: a 128-bit XXH3 hash, and
//! whether every element is the same (and zero).

use xxhash_rust::xxh3::Xxh3;

/// What a tensor's bytes amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    pub hash: u128,
    pub uniform: Uniform,
}

/// Whether all elements are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uniform {
    /// At least two elements differ (or the tensor has at most one element).
    No,
    /// Every byte is zero.
    Zero,
    /// Every element holds the same non-zero bit pattern.
    Same,
}

/// Feeds on a tensor's bytes chunk by chunk.
pub struct Digester {
    hash: Xxh3,
    element: usize,
    first: Vec<u8>,
    seen: u64,
    same: bool,
}

impl Digester {
    /// For elements of `element` bytes.
    pub fn new(element: usize) -> Digester {
        Digester {
            hash: Xxh3::new(),
            element: element.max(1),
            first: Vec::new(),
            seen: 0,
            same: true,
        }
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.hash.update(chunk);
        if self.same {
            self.same = self.still_same(chunk);
        }
        self.seen += chunk.len() as u64;
    }

    /// Whether the elements so far and those of `chunk` all equal the first one. A
    /// chunk is uniform when it equals itself shifted by one element (a memcmp, so this
    /// costs little next to reading); it then only has to start with the first element.
    fn still_same(&mut self, chunk: &[u8]) -> bool {
        let e = self.element;
        if !chunk.len().is_multiple_of(e) || !self.seen.is_multiple_of(e as u64) {
            // Chunks are whole elements; if one is not, say "not uniform" rather
            // than guess (the answer only feeds a note).
            return false;
        }
        if chunk.is_empty() {
            return true;
        }
        if self.first.is_empty() {
            self.first = chunk[..e].to_vec();
        }
        chunk[..e] == self.first[..] && chunk[e..] == chunk[..chunk.len() - e]
    }

    pub fn finish(self) -> Digest {
        let uniform = if !self.same || self.seen <= self.element as u64 {
            Uniform::No
        } else if self.first.iter().all(|&b| b == 0) {
            Uniform::Zero
        } else {
            Uniform::Same
        };
        Digest {
            hash: self.hash.digest128(),
            uniform,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(element: usize, chunks: &[&[u8]]) -> Digest {
        let mut d = Digester::new(element);
        for c in chunks {
            d.update(c);
        }
        d.finish()
    }

    #[test]
    fn uniformity_is_per_element_across_chunks() {
        let ones = 1.0f32.to_le_bytes().repeat(4);
        assert_eq!(digest(4, &[&ones, &ones]).uniform, Uniform::Same);
        assert_eq!(digest(4, &[&[0; 8], &[0; 12]]).uniform, Uniform::Zero);
        // Uniform chunks that disagree with each other.
        let twos = 2.0f32.to_le_bytes().repeat(4);
        assert_eq!(digest(4, &[&ones, &twos]).uniform, Uniform::No);
        // Bytes equal in pairs but not as 4-byte elements.
        assert_eq!(digest(4, &[&[1, 2, 1, 2, 1, 2, 1, 1]]).uniform, Uniform::No);
        // The same bytes as 2-byte elements are uniform until the last one.
        assert_eq!(digest(2, &[&[1, 2, 1, 2, 1, 2]]).uniform, Uniform::Same);
        // One element says nothing.
        assert_eq!(digest(4, &[&[0; 4]]).uniform, Uniform::No);
    }

    #[test]
    fn the_hash_does_not_depend_on_chunking() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let whole = digest(2, &[&bytes]).hash;
        let (a, b) = bytes.split_at(4_096);
        assert_eq!(digest(2, &[a, b]).hash, whole);
        let mut flipped = bytes.clone();
        flipped[9_999] ^= 1;
        assert_ne!(digest(2, &[&flipped]).hash, whole);
    }
}
