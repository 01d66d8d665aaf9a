//! Stores in an S3-compatible bucket (`s3://BUCKET/PREFIX`) for `compfs mkfs`, `mount`,
//! `usage` and `gc`: opening such a store, its errors as one-line messages. The `-o` options
//! are [`compfs_store::object::split_options`].

use std::path::Path;

use anyhow::{anyhow, Result};
use compfs_store::object::{self, ObjectOptions, ObjectStoreHandle, S3Url};
use compfs_store::{CreateOptions, OpenOptions, Tuning};

/// The `s3://…` URL `p` names, if it names one.
pub fn url_of(p: &Path) -> Result<Option<S3Url>> {
    Ok(S3Url::from_path(p)?)
}

pub fn create(url: &S3Url, o: &ObjectOptions, opts: &CreateOptions) -> Result<()> {
    object::create(url, o, opts, Tuning::default()).map_err(|e| anyhow!("{e}"))
}

pub fn open(url: &S3Url, o: &ObjectOptions, opts: &OpenOptions) -> Result<ObjectStoreHandle> {
    object::open(url, o, opts, Tuning::default()).map_err(|e| match e {
        // One line naming the holder and what to do.
        compfs_store::Error::LeaseHeld(m) => anyhow!("{m}"),
        compfs_store::Error::InUse(_) => anyhow!(
            "store {url} is in use on this machine (already mounted with cache directory {}?)",
            o.cache_dir_for(url).display()
        ),
        e => anyhow!("cannot open store {url}: {e}"),
    })
}
