//! NBD metadata contexts: parsing `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`
//! payloads and matching their queries against the one context this server has,
//! `base:allocation` (proto.md, "Metadata querying"). Pure functions over bytes.

/// The only metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id `base:allocation` gets from `NBD_OPT_SET_META_CONTEXT` (any nonzero value would do;
/// `NBD_OPT_LIST_META_CONTEXT` replies carry 0, as the spec asks).
pub const BASE_ALLOCATION_ID: u32 = 1;
/// Longest string (export name, query) the spec allows.
pub const MAX_STRING: usize = 4096;

/// A parsed meta context option: the export name and the queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaOption {
    pub name: Vec<u8>,
    pub queries: Vec<Vec<u8>>,
}

/// Why a meta context option is refused with `NBD_REP_ERR_INVALID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("meta context option lengths do not add up")]
    Lengths,
    #[error("export name or query longer than 4096 bytes")]
    TooLong,
}

fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

/// Parses the payload: u32 name length, name, u32 query count, count × (u32 length, query).
/// Every length is checked against the bytes actually present before anything is allocated, and
/// the lengths must account for the payload exactly.
pub fn parse_meta_option(data: &[u8]) -> Result<MetaOption, MetaError> {
    let nlen = be32(data).ok_or(MetaError::Lengths)? as usize;
    if nlen > MAX_STRING {
        return Err(MetaError::TooLong);
    }
    let rest = data.get(4..).ok_or(MetaError::Lengths)?;
    let name = rest.get(..nlen).ok_or(MetaError::Lengths)?.to_vec();
    let rest = &rest[nlen..];
    let count = be32(rest).ok_or(MetaError::Lengths)?;
    let mut rest = &rest[4..];
    let mut queries = Vec::new();
    for _ in 0..count {
        // Each query takes at least 4 bytes, so a huge count fails here after at most
        // data.len() / 4 rounds.
        let qlen = be32(rest).ok_or(MetaError::Lengths)? as usize;
        if qlen > MAX_STRING {
            return Err(MetaError::TooLong);
        }
        let q = rest.get(4..4 + qlen).ok_or(MetaError::Lengths)?;
        queries.push(q.to_vec());
        rest = &rest[4 + qlen..];
    }
    if !rest.is_empty() {
        return Err(MetaError::Lengths);
    }
    Ok(MetaOption { name, queries })
}

/// Encodes a meta context option payload (for clients and tests).
pub fn encode_meta_option(name: &[u8], queries: &[&[u8]]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name);
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q);
    }
    d
}

/// Whether the queries select `base:allocation`. With `list` (NBD_OPT_LIST_META_CONTEXT), no
/// query means every context and `base:` is a wildcard for the namespace; with SET, no query
/// selects nothing and `base:` is ignored, as proto.md requires. Queries of other namespaces,
/// unknown leaf names of `base:` and queries without a namespace are ignored (the spec allows
/// refusing the last kind; nbdkit ignores them, and so does this server).
pub fn selects_base_allocation(queries: &[Vec<u8>], list: bool) -> bool {
    if queries.is_empty() {
        return list;
    }
    queries
        .iter()
        .any(|q| q.as_slice() == BASE_ALLOCATION.as_bytes() || (list && q.as_slice() == b"base:"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn roundtrip_and_selection() {
        let d = encode_meta_option(b"disk", &[b"base:allocation", b"qemu:dirty-bitmap:x"]);
        let m = parse_meta_option(&d).unwrap();
        assert_eq!(m.name, b"disk");
        assert_eq!(m.queries.len(), 2);
        assert!(selects_base_allocation(&m.queries, false));
        // LIST: no query lists everything, "base:" is a wildcard; SET: neither selects.
        assert!(selects_base_allocation(&[], true));
        assert!(!selects_base_allocation(&[], false));
        let wild = vec![b"base:".to_vec()];
        assert!(selects_base_allocation(&wild, true));
        assert!(!selects_base_allocation(&wild, false));
        // Unknown namespaces and leaf names, and queries without a namespace, are ignored.
        let other = vec![
            b"x-foo:bar".to_vec(),
            b"base:nothing".to_vec(),
            b"allocation".to_vec(),
        ];
        assert!(!selects_base_allocation(&other, false));
        assert!(!selects_base_allocation(&other, true));
    }

    #[test]
    fn malformed_payloads() {
        assert_eq!(parse_meta_option(&[]), Err(MetaError::Lengths));
        assert_eq!(parse_meta_option(&[0, 0, 0]), Err(MetaError::Lengths));
        // Name length past the data.
        assert_eq!(
            parse_meta_option(&[0, 0, 0, 9, b'a']),
            Err(MetaError::Lengths)
        );
        // Name over 4096 bytes.
        assert_eq!(parse_meta_option(&[0, 0, 0x10, 1]), Err(MetaError::TooLong));
        // A huge query count with no queries fails without allocating for the count.
        assert_eq!(
            parse_meta_option(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
            Err(MetaError::Lengths)
        );
        // Trailing bytes.
        let mut d = encode_meta_option(b"", &[b"base:allocation"]);
        d.push(0);
        assert_eq!(parse_meta_option(&d), Err(MetaError::Lengths));
        // A query length past the data.
        let mut d = encode_meta_option(b"", &[b"base:allocation"]);
        d.pop();
        assert_eq!(parse_meta_option(&d), Err(MetaError::Lengths));
    }
}
