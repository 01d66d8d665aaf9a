//! fsck of the store dictionaries (format version 3): every record is loaded and checked, and
//! every extent and inline datum decodes with the dictionary it names.

use std::collections::BTreeMap;
use std::sync::Arc;

use redb::{ReadTransaction, ReadableTable};

use super::{Ctx, ProblemKind};
use crate::dict::StoreDict;
use crate::error::Result;
use crate::meta;
use crate::read::DictRef;
use crate::records::DictRec;

/// The dictionaries by id, checked and digested, or why one cannot be used.
pub(super) type Dicts = BTreeMap<u16, std::result::Result<Arc<StoreDict>, String>>;

/// Loads every dictionary (a store without the table has none). A record that does not
/// decode or a damaged dictionary is reported here; the extents and inline data using it are
/// reported as corrupt by the passes that decode them.
pub(super) fn load_dicts(txn: &ReadTransaction, c: &mut Ctx) -> Result<Dicts> {
    let mut dicts = BTreeMap::new();
    let t = match txn.open_table(meta::DICTS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(dicts),
        Err(e) => return Err(e.into()),
    };
    for r in t.iter()? {
        let (k, v) = r?;
        let id = k.value();
        let d = match DictRec::decode(v.value()) {
            Ok(rec) => crate::dict::digest(id, &rec, 0),
            Err(e) => Err(format!("dictionary {id}: {e}")),
        };
        if let Err(e) = &d {
            c.add(ProblemKind::BadRecord, None, e.clone());
        }
        dicts.insert(id, d);
    }
    Ok(dicts)
}

/// The dictionary `id` names, for a decoder: none for 0; an id the `dicts` table does not
/// hold is corrupt metadata.
pub(super) fn dict_of(l: &super::passes::Loaded, id: u16) -> DictRef<'_> {
    if id == 0 {
        return Ok(None);
    }
    match l.dicts.get(&id) {
        Some(Ok(d)) => Ok(Some(&d.dict)),
        Some(Err(e)) => Err(e.clone()),
        None => Err(format!("names unknown dictionary {id}")),
    }
}
