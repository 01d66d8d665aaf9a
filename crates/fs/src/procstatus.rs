//! The fields of `/proc/TID/status` that permission checks need: the caller's thread group,
//! supplementary groups and effective capabilities. One parser for the privilege rules
//! ([`crate::privilege`]) and the defrag channel ([`crate::defrag`]).

/// What was found in a `/proc/TID/status` text. A field is `None` when its line is missing or
/// malformed; each caller decides what a missing field means (always the narrower rights).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    /// `Tgid:`, the process the thread belongs to.
    pub tgid: Option<u32>,
    /// `Groups:`, the supplementary groups (empty when the line is empty).
    pub groups: Option<Vec<u32>>,
    /// `CapEff:`, the effective capability set.
    pub cap_eff: Option<u64>,
}

impl ProcStatus {
    /// Parses the text of a status file. Never fails: unknown lines are skipped and a bad
    /// value leaves its field `None`.
    pub fn parse(text: &str) -> ProcStatus {
        let mut st = ProcStatus::default();
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("Tgid:") {
                st.tgid = v.trim().parse().ok();
            } else if let Some(g) = line.strip_prefix("Groups:") {
                st.groups = g
                    .split_ascii_whitespace()
                    .map(|s| s.parse().ok())
                    .collect::<Option<Vec<u32>>>();
            } else if let Some(c) = line.strip_prefix("CapEff:") {
                st.cap_eff = u64::from_str_radix(c.trim(), 16).ok();
            }
        }
        st
    }

    /// The status of thread `tid`; all fields `None` when it cannot be read (the caller
    /// exited, or `tid` is 0 as in requests the kernel makes itself).
    pub fn read(tid: u32) -> ProcStatus {
        if tid == 0 {
            return ProcStatus::default();
        }
        std::fs::read_to_string(format!("/proc/{tid}/status"))
            .map(|t| ProcStatus::parse(&t))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_parsed() {
        let text = "Name:\tsh\nTgid:\t41\nPid:\t42\nUid:\t1000\t1000\t1000\t1000\n\
                    Groups:\t4 24 1000 \nCapInh:\t0000000000000000\nCapEff:\t0000000000000010\n";
        let st = ProcStatus::parse(text);
        assert_eq!(st.tgid, Some(41));
        assert_eq!(st.groups, Some(vec![4, 24, 1000]));
        assert_eq!(st.cap_eff, Some(0x10));
        let st = ProcStatus::parse("Groups:\t\nCapEff:\t000001ffffffffff\n");
        assert_eq!(
            (st.groups, st.cap_eff),
            (Some(vec![]), Some(0x1ff_ffff_ffff))
        );
    }

    #[test]
    fn missing_or_malformed_fields_are_none() {
        assert_eq!(ProcStatus::parse(""), ProcStatus::default());
        let st = ProcStatus::parse("Tgid: x\nGroups:\t4 x\nCapEff:\tzz\n");
        assert_eq!(st, ProcStatus::default());
        assert_eq!(ProcStatus::read(0), ProcStatus::default());
    }

    #[test]
    fn this_process_is_read() {
        let st = ProcStatus::read(std::process::id());
        assert_eq!(st.tgid, Some(std::process::id()));
        assert!(st.groups.is_some() && st.cap_eff.is_some());
    }
}
