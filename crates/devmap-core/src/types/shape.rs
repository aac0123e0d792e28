//! Tensor shapes, stored without a heap allocation when they can be: up to four dims
//! that each fit in 32 bits (every shape in today's checkpoints) sit inline. A model of
//! 100,000 tensors then spends 24 bytes per shape instead of a vector and its heap block.

use std::fmt;

#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Shape {
    Inline { len: u8, dims: [u32; 4] },
    Heap(Box<[u64]>),
}

impl Shape {
    pub fn new(dims: &[u64]) -> Shape {
        if dims.len() <= 4 && dims.iter().all(|&d| u32::try_from(d).is_ok()) {
            let mut inline = [0u32; 4];
            for (slot, &d) in inline.iter_mut().zip(dims) {
                // Checked above: every dim fits.
                *slot = d as u32;
            }
            Shape::Inline {
                len: dims.len() as u8,
                dims: inline,
            }
        } else {
            Shape::Heap(dims.into())
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Shape::Inline { len, .. } => usize::from(*len),
            Shape::Heap(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(move |i| match self {
            Shape::Inline { dims, .. } => u64::from(dims[i]),
            Shape::Heap(d) => d[i],
        })
    }

    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

impl From<Vec<u64>> for Shape {
    fn from(v: Vec<u64>) -> Shape {
        Shape::new(&v)
    }
}

impl From<&[u64]> for Shape {
    fn from(v: &[u64]) -> Shape {
        Shape::new(v)
    }
}

impl PartialEq<[u64]> for Shape {
    fn eq(&self, other: &[u64]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, &b)| a == b)
    }
}

impl PartialEq<Vec<u64>> for Shape {
    fn eq(&self, other: &Vec<u64>) -> bool {
        self == other.as_slice()
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl serde::Serialize for Shape {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_heap_shapes_read_back() {
        for dims in [
            vec![],
            vec![0, 3],
            vec![7],
            vec![1, 2, 3, 4],
            vec![1, 2, 3, 4, 5],
            vec![1 << 33],
        ] {
            let s = Shape::new(&dims);
            assert_eq!(s.to_vec(), dims);
            assert_eq!(s, dims);
            assert_eq!(format!("{s:?}"), format!("{dims:?}"));
        }
        assert!(matches!(Shape::new(&[1, 2]), Shape::Inline { .. }));
        assert!(matches!(Shape::new(&[1 << 33]), Shape::Heap(_)));
        assert_eq!(std::mem::size_of::<Shape>(), 24);
    }
}
