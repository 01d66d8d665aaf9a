//! Codec specifications in btrfs syntax (`zstd`, `zstd:5`, `zstd:-10`, `zlib:9`, `lzo`, `lz4`,
//! `none`/`no`) and the one table of algorithms, level ranges, defaults and workspace sizes that
//! the parser, `--help` and the docs all read.

use std::fmt;
use std::str::FromStr;

use crate::error::SpecError;

/// A compression algorithm. The numeric ids are stored on disk (extent headers, page records) and
/// must never change; 0..=3 follow btrfs's `BTRFS_COMPRESS_*` numbering, lz4 takes the next id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    None,
    Zlib,
    Lzo,
    Zstd,
    Lz4,
}

/// Static facts about one algorithm: the row of the level table.
#[derive(Debug, Clone, Copy)]
pub struct AlgorithmInfo {
    pub algorithm: Algorithm,
    /// Name used in specs and reports.
    pub name: &'static str,
    /// Lowest level btrfs accepts (0 when the algorithm has no levels).
    pub min_level: i32,
    /// Highest level btrfs accepts.
    pub max_level: i32,
    /// Highest level compfs accepts (an extension beyond btrfs for zstd: 16..19).
    pub max_level_ext: i32,
    /// Level used when none is given (or `:0`, as in btrfs).
    pub default_level: i32,
    /// One-line description for `--help`.
    pub summary: &'static str,
}

/// The level table. Ranges and defaults mirror btrfs (fs/btrfs/zlib.c, zstd.c, lzo.c);
/// lz4 has no levels, as in f2fs and zram.
pub const ALGORITHMS: [AlgorithmInfo; 5] = [
    AlgorithmInfo {
        algorithm: Algorithm::None,
        name: "none",
        min_level: 0,
        max_level: 0,
        max_level_ext: 0,
        default_level: 0,
        summary: "store data uncompressed",
    },
    AlgorithmInfo {
        algorithm: Algorithm::Zlib,
        name: "zlib",
        min_level: 1,
        max_level: 9,
        max_level_ext: 9,
        default_level: 3,
        summary: "deflate in zlib framing, levels 1..9 (default 3)",
    },
    AlgorithmInfo {
        algorithm: Algorithm::Lzo,
        name: "lzo",
        min_level: 0,
        max_level: 0,
        max_level_ext: 0,
        default_level: 0,
        summary: "LZO1X-1, no levels",
    },
    AlgorithmInfo {
        algorithm: Algorithm::Zstd,
        name: "zstd",
        min_level: -15,
        max_level: 15,
        max_level_ext: 19,
        default_level: 3,
        summary: "zstd, levels -15..-1 (fast) and 1..15 (default 3); 16..19 as an extension",
    },
    AlgorithmInfo {
        algorithm: Algorithm::Lz4,
        name: "lz4",
        min_level: 0,
        max_level: 0,
        max_level_ext: 0,
        default_level: 0,
        summary: "LZ4 block format, no levels",
    },
];

/// btrfs zstd workspace memory per level, in bytes (seed 001; `docs/kernel-reference.md`), for
/// comparison with compfs's measured context sizes.
pub fn btrfs_zstd_workspace_bytes(level: i32) -> Option<u64> {
    Some(match level {
        -15..=-1 => 926_969,
        1 => 943_353,
        2 => 1_041_657,
        3 => 1_303_801,
        4 => 1_959_161,
        5..=10 => 1_697_017,
        11 => 1_959_161,
        12 => 2_483_449,
        13 => 2_632_633,
        14 | 15 => 3_277_111,
        _ => return None,
    })
}

impl Algorithm {
    /// All algorithms in table order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::None,
        Algorithm::Zlib,
        Algorithm::Lzo,
        Algorithm::Zstd,
        Algorithm::Lz4,
    ];

    /// The table row for this algorithm.
    pub fn info(self) -> &'static AlgorithmInfo {
        // ALGORITHMS is indexed by the on-disk id, which `id()` maps one-to-one.
        &ALGORITHMS[self.id() as usize]
    }

    /// Stable on-disk id.
    pub fn id(self) -> u8 {
        match self {
            Algorithm::None => 0,
            Algorithm::Zlib => 1,
            Algorithm::Lzo => 2,
            Algorithm::Zstd => 3,
            Algorithm::Lz4 => 4,
        }
    }

    /// Inverse of [`Algorithm::id`].
    pub fn from_id(id: u8) -> Option<Algorithm> {
        Algorithm::ALL.get(id as usize).copied()
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Whether the algorithm takes a level.
    pub fn has_levels(self) -> bool {
        let i = self.info();
        i.min_level != i.max_level_ext
    }

    fn from_name(name: &str) -> Option<Algorithm> {
        match name {
            "none" | "no" => Some(Algorithm::None),
            _ => ALGORITHMS
                .iter()
                .find(|i| i.name == name)
                .map(|i| i.algorithm),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm with a level. Constructed through [`CodecSpec::parse`] or [`CodecSpec::with_level`],
/// which keep the level inside the algorithm's range (0 for algorithms without levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodecSpec {
    algorithm: Algorithm,
    level: i32,
}

/// Why a level was changed while parsing: btrfs clamps silently, compfs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelAdjustment {
    /// The level was outside the range and was clamped to the nearest bound.
    Clamped {
        algorithm: Algorithm,
        requested: i32,
        used: i32,
    },
    /// The algorithm has no levels; the given one was ignored.
    Ignored {
        algorithm: Algorithm,
        requested: i32,
    },
}

impl fmt::Display for LevelAdjustment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LevelAdjustment::Clamped {
                algorithm,
                requested,
                used,
            } => {
                let i = algorithm.info();
                write!(
                    f,
                    "{algorithm} level {requested} is out of range {}..{}; using {algorithm}:{used}",
                    i.min_level, i.max_level_ext
                )
            }
            LevelAdjustment::Ignored {
                algorithm,
                requested,
            } => write!(
                f,
                "{algorithm} has no compression levels; ignoring level {requested}"
            ),
        }
    }
}

/// The result of parsing a spec: the spec and, when the level was changed, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub spec: CodecSpec,
    pub adjustment: Option<LevelAdjustment>,
}

/// The valid forms, listed in every parse error.
pub const VALID_FORMS: &str =
    "none, no, lzo, lz4, zlib, zlib:1..9, zstd, zstd:-15..-1, zstd:1..15 (16..19 accepted)";

impl CodecSpec {
    /// The algorithm's default level.
    pub fn default_for(algorithm: Algorithm) -> CodecSpec {
        CodecSpec {
            algorithm,
            level: algorithm.info().default_level,
        }
    }

    /// An explicit level, clamped like the parser does (`0` means the default, as in btrfs).
    pub fn with_level(algorithm: Algorithm, level: i32) -> Parsed {
        let info = algorithm.info();
        if !algorithm.has_levels() {
            let adjustment = (level != 0).then_some(LevelAdjustment::Ignored {
                algorithm,
                requested: level,
            });
            return Parsed {
                spec: CodecSpec::default_for(algorithm),
                adjustment,
            };
        }
        if level == 0 {
            return Parsed {
                spec: CodecSpec::default_for(algorithm),
                adjustment: None,
            };
        }
        let used = level.clamp(info.min_level, info.max_level_ext);
        let adjustment = (used != level).then_some(LevelAdjustment::Clamped {
            algorithm,
            requested: level,
            used,
        });
        Parsed {
            spec: CodecSpec {
                algorithm,
                level: used,
            },
            adjustment,
        }
    }

    /// Parse btrfs syntax: `ALG` or `ALG:LEVEL`.
    pub fn parse(s: &str) -> Result<Parsed, SpecError> {
        let s = s.trim();
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let algorithm = Algorithm::from_name(&name.to_ascii_lowercase()).ok_or_else(|| {
            SpecError::UnknownAlgorithm {
                spec: s.to_string(),
            }
        })?;
        let level = match level {
            None => return Ok(CodecSpec::with_level(algorithm, 0)),
            Some(l) => l.trim().parse::<i32>().map_err(|_| SpecError::BadLevel {
                spec: s.to_string(),
            })?,
        };
        Ok(CodecSpec::with_level(algorithm, level))
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The level (0 for algorithms without levels).
    pub fn level(&self) -> i32 {
        self.level
    }

    /// No compression at all.
    pub fn none() -> CodecSpec {
        CodecSpec::default_for(Algorithm::None)
    }

    pub fn is_none(&self) -> bool {
        self.algorithm == Algorithm::None
    }
}

impl Default for CodecSpec {
    /// zstd:3, compfs's default (btrfs's bare `compress` means zlib:3; see [`bare_compress`]).
    fn default() -> Self {
        CodecSpec::default_for(Algorithm::Zstd)
    }
}

/// What btrfs's bare `-o compress` means: zlib at its default level.
pub fn bare_compress() -> CodecSpec {
    CodecSpec::default_for(Algorithm::Zlib)
}

impl fmt::Display for CodecSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.algorithm.has_levels() {
            write!(f, "{}:{}", self.algorithm, self.level)
        } else {
            write!(f, "{}", self.algorithm)
        }
    }
}

impl FromStr for CodecSpec {
    type Err = SpecError;
    /// Parses and drops any level adjustment; use [`CodecSpec::parse`] to report it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CodecSpec::parse(s).map(|p| p.spec)
    }
}

/// Compression mode, as btrfs's mount options name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `compress=ALG`: the heuristic decides per extent whether to try.
    Heuristic,
    /// `compress-force=ALG`: always try; keep the result only if it saves space.
    Force,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Heuristic => "compress",
            Mode::Force => "compress-force",
        })
    }
}

/// A list of specs given as ranges, as `compfs bench codecs --levels` takes them:
/// `zstd:-15..15,zlib:1..9,lzo,lz4`. Levels in a range that do not exist (zstd:0) are skipped.
pub fn parse_level_list(s: &str) -> Result<Vec<CodecSpec>, SpecError> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.split_once(':') {
            Some((name, range)) if range.contains("..") => {
                let (a, b) = range.split_once("..").ok_or_else(|| SpecError::BadLevel {
                    spec: item.to_string(),
                })?;
                let parse = |x: &str| {
                    x.trim().parse::<i32>().map_err(|_| SpecError::BadLevel {
                        spec: item.to_string(),
                    })
                };
                let (lo, hi) = (parse(a)?, parse(b)?);
                if lo > hi {
                    return Err(SpecError::BadLevel {
                        spec: item.to_string(),
                    });
                }
                for level in lo..=hi {
                    if level == 0 {
                        continue;
                    }
                    let p = CodecSpec::parse(&format!("{name}:{level}"))?;
                    if p.adjustment.is_none() && !out.contains(&p.spec) {
                        out.push(p.spec);
                    }
                }
            }
            _ => {
                let p = CodecSpec::parse(item)?;
                if !out.contains(&p.spec) {
                    out.push(p.spec);
                }
            }
        }
    }
    if out.is_empty() {
        return Err(SpecError::UnknownAlgorithm {
            spec: s.to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Parsed {
        CodecSpec::parse(s).unwrap()
    }

    #[test]
    fn parses_btrfs_forms() {
        assert_eq!(p("zstd").spec, CodecSpec::default_for(Algorithm::Zstd));
        assert_eq!(p("zstd").spec.level(), 3);
        assert_eq!(p("zstd:5").spec.level(), 5);
        assert_eq!(p("zstd:-10").spec.level(), -10);
        assert_eq!(p("zlib:9").spec.level(), 9);
        assert_eq!(p("zlib").spec.level(), 3);
        assert_eq!(p("lzo").spec.algorithm(), Algorithm::Lzo);
        assert_eq!(p("lz4").spec.algorithm(), Algorithm::Lz4);
        assert_eq!(p("none").spec, CodecSpec::none());
        assert_eq!(p("no").spec, CodecSpec::none());
        assert_eq!(p("ZSTD:7").spec.level(), 7);
        assert!(p("zstd:19").adjustment.is_none());
    }

    #[test]
    fn zero_means_default() {
        assert_eq!(p("zstd:0").spec.level(), 3);
        assert_eq!(p("zlib:0").spec.level(), 3);
        assert!(p("zstd:0").adjustment.is_none());
    }

    #[test]
    fn clamps_and_reports() {
        let x = p("zstd:25");
        assert_eq!(x.spec.level(), 19);
        assert_eq!(
            x.adjustment,
            Some(LevelAdjustment::Clamped {
                algorithm: Algorithm::Zstd,
                requested: 25,
                used: 19
            })
        );
        assert_eq!(p("zstd:-20").spec.level(), -15);
        assert_eq!(p("zlib:10").spec.level(), 9);
        assert_eq!(p("zlib:-1").spec.level(), 1);
        let l = p("lzo:3");
        assert_eq!(l.spec, CodecSpec::default_for(Algorithm::Lzo));
        assert!(matches!(
            l.adjustment,
            Some(LevelAdjustment::Ignored { .. })
        ));
        assert!(l
            .adjustment
            .unwrap()
            .to_string()
            .contains("no compression levels"));
    }

    #[test]
    fn garbage_is_a_typed_error_listing_valid_forms() {
        for bad in [
            "zstd:abc", "brotli", "zlib:", "", ":3", "zstd:3:4", "zstd:1.5",
        ] {
            let e = CodecSpec::parse(bad).unwrap_err();
            assert!(e.to_string().contains(VALID_FORMS), "{bad}: {e}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "zstd:3", "zstd:-5", "zlib:9", "lzo", "lz4", "none", "zstd:19",
        ] {
            assert_eq!(p(s).spec.to_string(), s);
            assert_eq!(p(&p(s).spec.to_string()).spec, p(s).spec);
        }
    }

    #[test]
    fn ids_are_stable() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_id(a.id()), Some(a));
            assert_eq!(a.info().algorithm, a);
        }
        assert_eq!(Algorithm::Zstd.id(), 3);
        assert_eq!(Algorithm::from_id(5), None);
    }

    #[test]
    fn level_lists() {
        let v = parse_level_list("zstd:-2..2,zlib:1..2,lzo,lz4").unwrap();
        let s: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            s,
            ["zstd:-2", "zstd:-1", "zstd:1", "zstd:2", "zlib:1", "zlib:2", "lzo", "lz4"]
        );
        assert!(parse_level_list("zstd:5..1").is_err());
        assert!(parse_level_list("foo").is_err());
        // Ranges beyond the table are cut to it, not clamped into duplicates.
        assert_eq!(parse_level_list("zlib:8..12").unwrap().len(), 2);
    }
}
