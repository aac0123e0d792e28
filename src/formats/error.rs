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
    Invalid { path: PathBuf, message: String },
    #[error(
        "{}: tensor `{}`: {}",
        crate::text::path(path),
        crate::text::escaped(tensor),
        crate::text::escaped(message)
    )]
    Tensor {
        path: PathBuf,
        tensor: String,
        message: String,
    },
}

impl FormatError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> FormatError {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }

    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn tensor(
        path: impl Into<PathBuf>,
        tensor: impl Into<String>,
        message: impl Into<String>,
    ) -> FormatError {
        FormatError::Tensor {
            path: path.into(),
            tensor: tensor.into(),
            message: message.into(),
        }
    }
}
