//! The one fio runner: runs a job with JSON output and reads the IOPS from its report.

use std::process::Command;

use crate::error::{bail, failed, Context, Result};

/// Runs `fio` with `args` (plus `--output-format=json`) and returns the IOPS of the first job
/// in the direction of `rw` (a `read` or a `write` job name such as `randwrite`).
pub fn iops(args: &[String], rw: &str) -> Result<f64> {
    let o = Command::new("fio")
        .args(args)
        .arg("--output-format=json")
        .output()
        .context("cannot run fio (scripts/deps.sh installs it)")?;
    if !o.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    parse_iops(&String::from_utf8_lossy(&o.stdout), rw)
}

/// The IOPS in fio's JSON report `text`; fio and its engines may print notes before the JSON
/// (the nbd engine prints "fio: connected to NBD server").
pub fn parse_iops(text: &str, rw: &str) -> Result<f64> {
    let json = text.find('{').map(|i| &text[i..]).unwrap_or("");
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| failed!("fio printed no JSON report: {e}"))?;
    let key = if rw.contains("read") { "read" } else { "write" };
    v["jobs"][0][key]["iops"]
        .as_f64()
        .ok_or_else(|| failed!("fio JSON has no {key} iops"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_iops_after_notes() {
        let text = "fio: connected to NBD server\n{\"jobs\": [{\"read\": {\"iops\": 12.5}, \
                    \"write\": {\"iops\": 99.0}}]}";
        assert_eq!(parse_iops(text, "randread").unwrap(), 12.5);
        assert_eq!(parse_iops(text, "randwrite").unwrap(), 99.0);
        assert!(parse_iops("{\"jobs\": []}", "randwrite").is_err());
        assert!(parse_iops("no json", "randwrite").is_err());
    }
}
