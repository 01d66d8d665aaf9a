//! Consistency checker (being implemented: see the commit log).
use crate::error::{Error, Result};
use crate::types::Ino;
use std::path::Path;

/// Kind of a problem found by [`fsck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    CorruptExtent,
}

/// One problem found by [`fsck`].
#[derive(Debug, Clone)]
pub struct FsckProblem {
    pub kind: ProblemKind,
    pub ino: Option<Ino>,
    pub message: String,
    pub repaired: bool,
}

/// What [`fsck`] found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    pub problems: Vec<FsckProblem>,
}

/// Checks a closed store. Not implemented in this revision: returns an error.
pub fn fsck(_dir: &Path, _repair: bool, _progress: &mut dyn FnMut(u64, u64)) -> Result<FsckReport> {
    Err(Error::InvalidArgument("fsck is not implemented in this revision".into()))
}
