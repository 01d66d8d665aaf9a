//! POSIX ACLs as the kernel's filesystems keep them (fs/posix_acl.c), for a FUSE daemon that
//! negotiated `FUSE_POSIX_ACL`: the kernel then enforces ACLs (it reads them with GETXATTR and
//! caches them) but leaves it to the daemon to keep the mode and the ACL in step and to apply
//! default ACLs (and, with `FUSE_DONT_MASK`, the umask) to new inodes.
//!
//! The ACLs travel and are stored as the kernel's xattr format (`system.posix_acl_access`,
//! `system.posix_acl_default`): a little-endian u32 version (2), then per entry a u16 tag, a
//! u16 permission (rwx = 4|2|1) and a u32 id (the uid or gid of named entries, -1 otherwise).
//!
//! Pure functions, one per kernel function they copy:
//! - [`Acl::parse`]: `posix_acl_from_xattr` + `posix_acl_valid`;
//! - [`Acl::equiv_mode`]: `posix_acl_equiv_mode`, the mode an access ACL implies;
//! - [`Acl::chmod`]: `__posix_acl_chmod`, chmod's update of an access ACL;
//! - [`Acl::create_masq`]: `posix_acl_create_masq`, and [`create`]: `posix_acl_create`;
//! - [`update_mode`]: `posix_acl_update_mode`, the mode after an access ACL is set.

use thiserror::Error;

/// xattr name of the access ACL.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// xattr name of a directory's default ACL.
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
/// `ACL_UNDEFINED_ID`: the id of entries that name nobody.
const UNDEFINED_ID: u32 = u32::MAX;

const S_IRWXU: u16 = 0o700;
const S_IRWXG: u16 = 0o070;
const S_IRWXO: u16 = 0o007;
const S_IRWXUGO: u16 = 0o777;
const S_ISGID: u16 = 0o2000;

/// Is `name` one of the two ACL xattrs?
pub fn is_acl_xattr(name: &[u8]) -> bool {
    name == ACCESS_XATTR || name == DEFAULT_XATTR
}

/// Why an ACL xattr value was refused (the kernel answers EINVAL to each).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AclError {
    #[error("ACL xattr of {0} bytes is not a 4-byte header plus 8-byte entries")]
    Size(usize),
    #[error("ACL xattr version {0}, expected 2")]
    Version(u32),
    #[error("ACL xattr has no entries")]
    Empty,
    #[error("ACL entry {index} has unknown tag {tag:#x}")]
    Tag { index: usize, tag: u16 },
    #[error("ACL entry {index} has permission bits {perm:#o} beyond rwx")]
    Perm { index: usize, perm: u16 },
    #[error("ACL entry {index} is out of order or repeated")]
    Order { index: usize },
    #[error("ACL entry {index} names id -1")]
    Id { index: usize },
    #[error("ACL lacks an owner, group or other entry")]
    Incomplete,
    #[error("ACL with named users or groups lacks a mask entry")]
    NoMask,
}

impl AclError {
    /// The errno the kernel gives for a malformed ACL.
    pub fn errno(&self) -> i32 {
        libc::EINVAL
    }
}

/// The tag of an ACL entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj,
    User,
    GroupObj,
    Group,
    Mask,
    Other,
}

impl Tag {
    fn from_raw(raw: u16) -> Option<Tag> {
        Some(match raw {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn raw(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }
}

/// One entry: tag, rwx bits (0..=7) and, for named entries, the uid or gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u16,
    pub id: u32,
}

/// A valid ACL (entries in the kernel's order: owner, users, group, groups, mask, other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parses and validates an xattr value. Memory is bounded by the input (one entry per
    /// 8 bytes).
    pub fn parse(bytes: &[u8]) -> Result<Acl, AclError> {
        if bytes.len() < HEADER || (bytes.len() - HEADER) % ENTRY != 0 {
            return Err(AclError::Size(bytes.len()));
        }
        let version = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if version != VERSION {
            return Err(AclError::Version(version));
        }
        let mut entries = Vec::with_capacity((bytes.len() - HEADER) / ENTRY);
        for (index, e) in bytes[HEADER..].chunks_exact(ENTRY).enumerate() {
            let raw = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = Tag::from_raw(raw).ok_or(AclError::Tag { index, tag: raw })?;
            let id = match tag {
                Tag::User | Tag::Group if id == UNDEFINED_ID => return Err(AclError::Id { index }),
                Tag::User | Tag::Group => id,
                // The kernel ignores the id of unnamed entries and writes -1 back.
                _ => UNDEFINED_ID,
            };
            entries.push(Entry { tag, perm, id });
        }
        let acl = Acl { entries };
        acl.validate()?;
        Ok(acl)
    }

    /// `posix_acl_valid`: the tags in order, each unnamed tag once, perms within rwx, a mask
    /// when there are named entries.
    fn validate(&self) -> Result<(), AclError> {
        if self.entries.is_empty() {
            return Err(AclError::Empty);
        }
        let mut prev: Option<Tag> = None;
        let mut named = false;
        let mut mask = false;
        for (index, e) in self.entries.iter().enumerate() {
            if e.perm & !7 != 0 {
                return Err(AclError::Perm {
                    index,
                    perm: e.perm,
                });
            }
            let ok = match (prev, e.tag) {
                (None, Tag::UserObj) => true,
                (Some(p), Tag::User) => p == Tag::UserObj || p == Tag::User,
                (Some(p), Tag::GroupObj) => p == Tag::UserObj || p == Tag::User,
                (Some(p), Tag::Group) => p == Tag::GroupObj || p == Tag::Group,
                (Some(p), Tag::Mask) => p == Tag::GroupObj || p == Tag::Group,
                (Some(p), Tag::Other) => matches!(p, Tag::GroupObj | Tag::Group | Tag::Mask),
                (None, _) => return Err(AclError::Incomplete),
                _ => false,
            };
            if !ok {
                return Err(AclError::Order { index });
            }
            named |= matches!(e.tag, Tag::User | Tag::Group);
            mask |= e.tag == Tag::Mask;
            prev = Some(e.tag);
        }
        if prev != Some(Tag::Other) {
            return Err(AclError::Incomplete);
        }
        if named && !mask {
            return Err(AclError::NoMask);
        }
        Ok(())
    }

    /// The xattr value of this ACL.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.raw().to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// `posix_acl_equiv_mode`: `perm` with its rwx bits replaced by what this access ACL
    /// grants (the mask stands in for the group bits), and whether the mode says everything
    /// the ACL does (only owner, group and other entries: the ACL need not be stored).
    pub fn equiv_mode(&self, perm: u16) -> (u16, bool) {
        let mut mode = 0u16;
        let mut equiv = true;
        for e in &self.entries {
            match e.tag {
                Tag::UserObj => mode |= (e.perm & S_IRWXO) << 6,
                Tag::GroupObj => mode |= (e.perm & S_IRWXO) << 3,
                Tag::Other => mode |= e.perm & S_IRWXO,
                Tag::Mask => {
                    mode = (mode & !S_IRWXG) | ((e.perm & S_IRWXO) << 3);
                    equiv = false;
                }
                Tag::User | Tag::Group => equiv = false,
            }
        }
        ((perm & !S_IRWXUGO) | mode, equiv)
    }

    /// `__posix_acl_chmod`: after a chmod to `perm`, the owner and other entries take its
    /// bits, and the mask (or, without one, the group entry) its group bits.
    pub fn chmod(&mut self, perm: u16) {
        let has_mask = self.entries.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => e.perm = (perm & S_IRWXU) >> 6,
                Tag::Other => e.perm = perm & S_IRWXO,
                Tag::Mask => e.perm = (perm & S_IRWXG) >> 3,
                Tag::GroupObj if !has_mask => e.perm = (perm & S_IRWXG) >> 3,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: this (inherited default) ACL restricted by the creation mode
    /// `perm`, and `perm` restricted by the ACL. Returns the new mode and whether the ACL says
    /// more than the mode (named entries or a mask: it must be stored).
    pub fn create_masq(&mut self, perm: u16) -> (u16, bool) {
        let mut mode = perm;
        let mut not_equiv = false;
        let has_mask = self.entries.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= (mode >> 6) & 7;
                    mode &= (e.perm << 6) | !S_IRWXU;
                }
                Tag::User | Tag::Group => not_equiv = true,
                Tag::Other => {
                    e.perm &= mode & 7;
                    mode &= e.perm | !S_IRWXO;
                }
                Tag::Mask => {
                    not_equiv = true;
                    e.perm &= (mode >> 3) & 7;
                    mode &= (e.perm << 3) | !S_IRWXG;
                }
                Tag::GroupObj if !has_mask => {
                    e.perm &= (mode >> 3) & 7;
                    mode &= (e.perm << 3) | !S_IRWXG;
                }
                Tag::GroupObj => {}
            }
        }
        ((perm & !S_IRWXUGO) | (mode & S_IRWXUGO), not_equiv)
    }
}

/// What a new inode gets: its permission bits and the ACLs to store with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub perm: u16,
    /// The access ACL (None when the mode says it all).
    pub access: Option<Acl>,
    /// The default ACL (directories inherit their parent's).
    pub default: Option<Acl>,
}

/// `posix_acl_create`: the mode and ACLs of a new inode with requested permission bits `perm`
/// in a directory whose default ACL is `parent_default`. Without a default ACL the umask
/// applies; with one it does not (the ACL takes its place). Symlinks take neither.
pub fn create(parent_default: Option<&Acl>, perm: u16, umask: u16, is_dir: bool) -> Created {
    match parent_default {
        None => Created {
            perm: perm & !(umask & S_IRWXUGO),
            access: None,
            default: None,
        },
        Some(d) => {
            let mut access = d.clone();
            let (perm, not_equiv) = access.create_masq(perm);
            Created {
                perm,
                access: not_equiv.then_some(access),
                default: is_dir.then(|| d.clone()),
            }
        }
    }
}

/// `posix_acl_update_mode`: the mode of an inode (permission bits `perm`) whose access ACL
/// is set to `acl`, and the ACL to store (None when the mode says it all: the xattr goes).
/// `keep_sgid`: the caller is in the file's group or holds CAP_FSETID; otherwise S_ISGID goes.
pub fn update_mode(acl: Acl, perm: u16, keep_sgid: bool) -> (u16, Option<Acl>) {
    let (mut mode, equiv) = acl.equiv_mode(perm);
    if !keep_sgid {
        mode &= !S_ISGID;
    }
    (mode, (!equiv).then_some(acl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(tag: Tag, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    fn acl(entries: &[Entry]) -> Acl {
        let a = Acl {
            entries: entries.to_vec(),
        };
        a.validate().unwrap();
        a
    }

    const U: u32 = UNDEFINED_ID;

    /// user::rwx user:1000:r-x group::r-x mask::rwx other::---
    fn named() -> Acl {
        acl(&[
            e(Tag::UserObj, 7, U),
            e(Tag::User, 5, 1000),
            e(Tag::GroupObj, 5, U),
            e(Tag::Mask, 7, U),
            e(Tag::Other, 0, U),
        ])
    }

    fn minimal(u: u16, g: u16, o: u16) -> Acl {
        acl(&[
            e(Tag::UserObj, u, U),
            e(Tag::GroupObj, g, U),
            e(Tag::Other, o, U),
        ])
    }

    #[test]
    fn round_trip_of_the_xattr_format() {
        let a = named();
        let b = a.to_bytes();
        assert_eq!(b.len(), 4 + 5 * 8);
        assert_eq!(&b[..4], &[2, 0, 0, 0]);
        // user:1000 entry: tag 2, perm 5, id 1000
        assert_eq!(&b[12..20], &[2, 0, 5, 0, 0xe8, 3, 0, 0]);
        assert_eq!(Acl::parse(&b).unwrap(), a);
    }

    #[test]
    fn malformed_values_are_typed_errors() {
        let good = named().to_bytes();
        assert_eq!(Acl::parse(&[]), Err(AclError::Size(0)));
        assert_eq!(Acl::parse(&good[..good.len() - 1]), Err(AclError::Size(43)));
        let mut v = good.clone();
        v[0] = 1;
        assert_eq!(Acl::parse(&v), Err(AclError::Version(1)));
        assert_eq!(Acl::parse(&2u32.to_le_bytes()), Err(AclError::Empty));
        let mut v = good.clone();
        v[4] = 0x40;
        assert_eq!(
            Acl::parse(&v),
            Err(AclError::Tag {
                index: 0,
                tag: 0x40
            })
        );
        let mut v = good.clone();
        v[6] = 8;
        assert_eq!(Acl::parse(&v), Err(AclError::Perm { index: 0, perm: 8 }));
        // named user with id -1
        let mut v = good.clone();
        v[16..20].copy_from_slice(&[0xff; 4]);
        assert_eq!(Acl::parse(&v), Err(AclError::Id { index: 1 }));
        // no mask with a named entry
        let a = Acl {
            entries: vec![
                e(Tag::UserObj, 7, U),
                e(Tag::User, 5, 1000),
                e(Tag::GroupObj, 5, U),
                e(Tag::Other, 0, U),
            ],
        };
        assert_eq!(Acl::parse(&a.to_bytes()), Err(AclError::NoMask));
        // out of order, repeated, missing
        for entries in [
            vec![
                e(Tag::GroupObj, 5, U),
                e(Tag::UserObj, 7, U),
                e(Tag::Other, 0, U),
            ],
            vec![
                e(Tag::UserObj, 7, U),
                e(Tag::UserObj, 7, U),
                e(Tag::GroupObj, 5, U),
                e(Tag::Other, 0, U),
            ],
            vec![e(Tag::UserObj, 7, U), e(Tag::Other, 0, U)],
            vec![e(Tag::UserObj, 7, U), e(Tag::GroupObj, 7, U)],
            vec![
                e(Tag::UserObj, 7, U),
                e(Tag::GroupObj, 5, U),
                e(Tag::Other, 0, U),
                e(Tag::Other, 0, U),
            ],
        ] {
            let r = Acl::parse(&Acl { entries }.to_bytes());
            assert!(
                matches!(r, Err(AclError::Order { .. } | AclError::Incomplete)),
                "{r:?}"
            );
        }
    }

    #[test]
    fn unnamed_ids_are_normalised() {
        let mut v = minimal(6, 4, 4).to_bytes();
        v[8..12].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(Acl::parse(&v).unwrap(), minimal(6, 4, 4));
    }

    #[test]
    fn equiv_mode_uses_the_mask_for_group_bits() {
        assert_eq!(named().equiv_mode(0o100644), (0o100770, false));
        assert_eq!(minimal(6, 4, 0).equiv_mode(0o4777), (0o4640, true));
    }

    #[test]
    fn chmod_updates_mask_or_group_entry() {
        let mut a = named();
        a.chmod(0o640);
        assert_eq!(
            a.entries()
                .iter()
                .map(|e| (e.tag, e.perm))
                .collect::<Vec<_>>(),
            vec![
                (Tag::UserObj, 6),
                (Tag::User, 5),
                (Tag::GroupObj, 5),
                (Tag::Mask, 4),
                (Tag::Other, 0)
            ]
        );
        let mut m = minimal(7, 7, 7);
        m.chmod(0o751);
        assert_eq!(m, minimal(7, 5, 1));
    }

    #[test]
    fn create_without_default_applies_the_umask() {
        let c = create(None, 0o666, 0o022, false);
        assert_eq!((c.perm, c.access, c.default), (0o644, None, None));
    }

    #[test]
    fn create_with_default_ignores_the_umask() {
        let d = named();
        // file: requested 0666, umask 077 is ignored
        let c = create(Some(&d), 0o666, 0o077, false);
        assert_eq!(c.perm, 0o660);
        let a = c.access.unwrap();
        let perms: Vec<u16> = a.entries().iter().map(|e| e.perm).collect();
        // owner rw, user:1000 r-x (masked at check time), group r-x, mask rw, other none
        assert_eq!(perms, vec![6, 5, 5, 6, 0]);
        assert_eq!(c.default, None);
        // directory: inherits the default ACL as its own default; setgid kept
        let c = create(Some(&d), 0o2777, 0o022, true);
        assert_eq!(c.perm, 0o2770);
        assert_eq!(c.default, Some(d));
        // a minimal default ACL gives no access ACL, only the mode
        let c = create(Some(&minimal(7, 5, 0)), 0o666, 0o022, false);
        assert_eq!((c.perm, c.access), (0o640, None));
    }

    #[test]
    fn update_mode_drops_equivalent_acls_and_sgid_for_outsiders() {
        assert_eq!(update_mode(minimal(6, 4, 0), 0o2755, true), (0o2640, None));
        assert_eq!(update_mode(minimal(6, 4, 0), 0o2755, false), (0o640, None));
        assert_eq!(update_mode(named(), 0o644, true), (0o770, Some(named())));
    }

    fn arb_acl() -> impl Strategy<Value = Acl> {
        (
            0u16..8,
            proptest::collection::vec((1u32..5000, 0u16..8), 0..4),
            0u16..8,
            proptest::collection::vec((1u32..5000, 0u16..8), 0..4),
            proptest::option::of(0u16..8),
            0u16..8,
        )
            .prop_map(|(uo, users, go, groups, mask, o)| {
                let mut v = vec![e(Tag::UserObj, uo, U)];
                v.extend(users.iter().map(|&(id, p)| e(Tag::User, p, id)));
                v.push(e(Tag::GroupObj, go, U));
                v.extend(groups.iter().map(|&(id, p)| e(Tag::Group, p, id)));
                let named = !users.is_empty() || !groups.is_empty();
                if let Some(m) = mask.or(named.then_some(7)) {
                    v.push(e(Tag::Mask, m, U));
                }
                v.push(e(Tag::Other, o, U));
                acl(&v)
            })
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Acl::parse(&bytes);
        }

        #[test]
        fn valid_acls_round_trip(a in arb_acl()) {
            prop_assert_eq!(Acl::parse(&a.to_bytes()), Ok(a));
        }

        #[test]
        fn corrupted_acls_never_panic(a in arb_acl(), at in 0usize..64, byte in any::<u8>()) {
            let mut b = a.to_bytes();
            let i = at % b.len();
            b[i] = byte;
            if let Ok(p) = Acl::parse(&b) {
                prop_assert!(p.validate().is_ok());
            }
        }

        /// chmod then equiv_mode gives the chmod's bits back (the mode and ACL agree).
        #[test]
        fn chmod_keeps_mode_and_acl_in_step(mut a in arb_acl(), perm in 0u16..0o7777) {
            a.chmod(perm);
            prop_assert_eq!(a.equiv_mode(perm).0, perm);
        }

        /// The mode of a new inode never grants more than requested, and agrees with its ACL.
        #[test]
        fn create_agrees_with_its_acl(d in arb_acl(), perm in 0u16..0o7777, umask in 0u16..0o777) {
            let c = create(Some(&d), perm, umask, false);
            prop_assert_eq!(c.perm & !perm, 0);
            if let Some(a) = &c.access {
                prop_assert_eq!(a.equiv_mode(c.perm).0, c.perm);
            }
        }
    }
}
