use std::io;
use std::path::PathBuf;

/// A problem with one input file. Every variant names the file; those about one tensor
/// name the tensor too.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read {}: {source}", crate::text::path(path))]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {}", crate::text::path(path), crate::text::escaped(message))]
    Invalid {
        path: PathBuf,
        kind: Kind,
        message: String,
    },
    #[error(
        "{}: tensor `{}`: {}",
        crate::text::path(path),
        crate::text::escaped(tensor),
        crate::text::escaped(message)
    )]
    Tensor {
        path: PathBuf,
        tensor: String,
        kind: Kind,
        message: String,
    },
}

/// What kind of problem an input has: a caller acts on the kind (a test asserts it, a
/// binding maps it to an exception); the message says it in words, naming what it is
/// about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The format's own rules are broken: a name twice, offsets that overlap, a field
    /// of the wrong type.
    Malformed,
    /// Not the format the file's name promises at all: not JSON, not a `torch.save`
    /// archive, not a state dict.
    NotTheFormat,
    /// Shorter than its own header or index says: cut off, or damaged.
    Truncated,
    /// Larger than anything of its kind should be; not read.
    TooLarge,
    /// Valid, but beyond what devmap reads yet (big-endian, a compressed member, an
    /// unknown dtype, a manifest of another version).
    Unsupported,
    /// Refused for safety: a pickle global outside the allowed set, a name that would
    /// leave its folder, a special file where a file should be.
    Unsafe,
    /// Something it refers to is not there: a shard, a tensor, a storage, a config.
    Missing,
}

impl FormatError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> FormatError {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }

    /// A file that breaks its format's rules ([`Kind::Malformed`]).
    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> FormatError {
        FormatError::invalid_as(Kind::Malformed, path, message)
    }

    pub fn invalid_as(
        kind: Kind,
        path: impl Into<PathBuf>,
        message: impl Into<String>,
    ) -> FormatError {
        FormatError::Invalid {
            path: path.into(),
            kind,
            message: message.into(),
        }
    }

    /// A tensor entry that breaks its format's rules ([`Kind::Malformed`]).
    pub fn tensor(
        path: impl Into<PathBuf>,
        tensor: impl Into<String>,
        message: impl Into<String>,
    ) -> FormatError {
        FormatError::tensor_as(Kind::Malformed, path, tensor, message)
    }

    pub fn tensor_as(
        kind: Kind,
        path: impl Into<PathBuf>,
        tensor: impl Into<String>,
        message: impl Into<String>,
    ) -> FormatError {
        FormatError::Tensor {
            path: path.into(),
            tensor: tensor.into(),
            kind,
            message: message.into(),
        }
    }

    /// The kind of problem; `None` for a file that could not be read at all.
    pub fn kind(&self) -> Option<Kind> {
        match self {
            FormatError::Io { .. } => None,
            FormatError::Invalid { kind, .. } | FormatError::Tensor { kind, .. } => Some(*kind),
        }
    }
}
