//! The command line of `mount.fuse.compfs` / `mount.compfs`, which `mount -t fuse.compfs` and
//! fstab run: `mount.fuse.compfs STORE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`.

use std::path::PathBuf;

/// What `mount` asks the helper to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperCall {
    /// `-f` (fake): nothing.
    Nothing,
    /// `-o remount,…`: the mount exists; only its flags change.
    Remount {
        mountpoint: PathBuf,
        options: Vec<String>,
    },
    /// Mount `store` on `mountpoint` with the `-o` lists.
    Mount {
        store: PathBuf,
        mountpoint: PathBuf,
        options: Vec<String>,
    },
}

/// A helper command line that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelperError {
    #[error("-o needs a value")]
    NoOptions,
    #[error("usage: mount.fuse.compfs STORE MOUNTPOINT -o remount,...")]
    RemountUsage,
    #[error(
        "usage: mount.fuse.compfs STORE MOUNTPOINT [-o OPTIONS] (called by mount -t fuse.compfs)"
    )]
    Usage,
}

/// Reads the helper's arguments (`args[0]` is the program name).
pub fn parse_helper_args(args: Vec<String>) -> Result<HelperCall, HelperError> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(it.next().ok_or(HelperError::NoOptions)?),
            "-t" | "-N" => {
                it.next();
            }
            s if s.starts_with("-o") && s.len() > 2 => options.push(s[2..].to_string()),
            // -s (sloppy), -f (fake), -n (no mtab), -v (verbose): nothing to do for FUSE.
            s if s.starts_with('-') && s.len() > 1 => {
                if s.contains('f') && !s.starts_with("--") {
                    return Ok(HelperCall::Nothing);
                }
            }
            _ => positional.push(PathBuf::from(a)),
        }
    }
    if options
        .iter()
        .any(|l| l.split(',').any(|o| o.trim() == "remount"))
    {
        let mountpoint = positional.pop().ok_or(HelperError::RemountUsage)?;
        return Ok(HelperCall::Remount {
            mountpoint,
            options,
        });
    }
    let [store, mountpoint]: [PathBuf; 2] =
        positional.try_into().map_err(|_| HelperError::Usage)?;
    Ok(HelperCall::Mount {
        store,
        mountpoint,
        options,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn call(args: &[&str]) -> Result<HelperCall, HelperError> {
        let mut v = vec!["mount.fuse.compfs".to_string()];
        v.extend(args.iter().map(|a| a.to_string()));
        parse_helper_args(v)
    }

    #[test]
    fn mount_passes_store_mountpoint_and_options() {
        assert_eq!(
            call(&[
                "/s",
                "/m",
                "-o",
                "rw,compress=lz4",
                "-t",
                "fuse.compfs",
                "-ocache=1G"
            ]),
            Ok(HelperCall::Mount {
                store: "/s".into(),
                mountpoint: "/m".into(),
                options: vec!["rw,compress=lz4".into(), "cache=1G".into()],
            })
        );
        assert_eq!(
            call(&["-sn", "/s", "/m", "-N", "ns"]),
            Ok(HelperCall::Mount {
                store: "/s".into(),
                mountpoint: "/m".into(),
                options: vec![],
            })
        );
    }

    #[test]
    fn fake_and_remount() {
        assert_eq!(call(&["/s", "/m", "-vf", "-o"]), Ok(HelperCall::Nothing));
        assert_eq!(
            call(&["/s", "/m", "-o", "remount, ro"]),
            Ok(HelperCall::Remount {
                mountpoint: "/m".into(),
                options: vec!["remount, ro".into()],
            })
        );
        assert_eq!(call(&["-o", "remount"]), Err(HelperError::RemountUsage));
    }

    #[test]
    fn bad_command_lines() {
        assert_eq!(call(&["/s", "/m", "-o"]), Err(HelperError::NoOptions));
        assert_eq!(call(&["/s"]), Err(HelperError::Usage));
        assert_eq!(call(&["/s", "/m", "/x"]), Err(HelperError::Usage));
        // A long option is no -f.
        assert!(matches!(
            call(&["/s", "/m", "--fake"]),
            Ok(HelperCall::Mount { .. })
        ));
    }
}
