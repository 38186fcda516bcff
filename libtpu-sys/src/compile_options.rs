//! A hand-written protobuf encoder for XLA's `CompileOptionsProto`, the serialized options
//! `PJRT_Client_Compile` takes.
//!
//! Only the fields needed to place a program on devices are written. Field numbers and types
//! come from `xla/pjrt/proto/compile_options.proto` and, for `DeviceAssignmentProto`,
//! `xla/xla_data.proto`:
//!
//! ```text
//! CompileOptionsProto          3: ExecutableBuildOptionsProto executable_build_options
//!                              4: bool compile_portable_executable
//! ExecutableBuildOptionsProto  1: int64 device_ordinal     4: int64 num_replicas
//!                              5: int64 num_partitions     6: bool use_spmd_partitioning
//!                              9: DeviceAssignmentProto device_assignment
//! DeviceAssignmentProto        1: int32 replica_count      2: int32 computation_count
//!                              3: repeated ComputationDevice computation_devices
//! ComputationDevice            1: repeated int64 replica_device_ids
//! ```
//!
//! The encoding is proto3: fields holding their zero value are left out, repeated integers are
//! packed, and fields are written in field-number order.

use std::fmt;

/// Options for compiling one program, encoded with [`CompileOptions::encode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Number of replicas (data-parallel copies); at least 1.
    pub num_replicas: u32,
    /// Number of partitions (model-parallel shards); at least 1.
    pub num_partitions: u32,
    /// Device to build for, or -1 to leave it to the plugin. XLA reads a missing field as
    /// device 0, so -1 is written out explicitly.
    pub device_ordinal: i64,
    /// Fixed placement: `device_assignment[replica][partition]` is a device id. `None` lets
    /// the plugin choose.
    pub device_assignment: Option<Vec<Vec<i64>>>,
    /// Partition with SPMD (one program, sharded) rather than MPMD.
    pub use_spmd_partitioning: bool,
    /// Build an executable that can later run on any device of the same kind.
    pub compile_portable_executable: bool,
}

impl Default for CompileOptions {
    /// One replica, one partition, no fixed device: what a single-device program needs.
    fn default() -> Self {
        Self {
            num_replicas: 1,
            num_partitions: 1,
            device_ordinal: -1,
            device_assignment: None,
            use_spmd_partitioning: false,
            compile_portable_executable: false,
        }
    }
}

/// Why a [`CompileOptions`] cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileOptionsError {
    /// `num_replicas` or `num_partitions` is zero.
    ZeroCount {
        /// Which count.
        what: &'static str,
    },
    /// A count does not fit the proto's `int32` field.
    CountTooLarge {
        /// Which count.
        what: &'static str,
        /// The value given.
        value: u32,
    },
    /// The device assignment has a different number of rows than replicas.
    AssignmentReplicas {
        /// `num_replicas`.
        expected: u32,
        /// Rows given.
        got: usize,
    },
    /// A row of the device assignment has a different length than the partition count.
    AssignmentPartitions {
        /// The replica whose row is wrong.
        replica: usize,
        /// `num_partitions`.
        expected: u32,
        /// Entries in that row.
        got: usize,
    },
}

impl fmt::Display for CompileOptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroCount { what } => write!(f, "{what} is 0; expected at least 1"),
            Self::CountTooLarge { what, value } => {
                write!(f, "{what} is {value}; expected at most {}", i32::MAX)
            }
            Self::AssignmentReplicas { expected, got } => write!(
                f,
                "device assignment has {got} replica rows; expected {expected} (num_replicas)"
            ),
            Self::AssignmentPartitions {
                replica,
                expected,
                got,
            } => write!(
                f,
                "device assignment row for replica {replica} has {got} entries; \
                 expected {expected} (num_partitions)"
            ),
        }
    }
}

impl std::error::Error for CompileOptionsError {}

impl CompileOptions {
    /// Serializes to `CompileOptionsProto` bytes, checking the counts and the assignment shape.
    pub fn encode(&self) -> Result<Vec<u8>, CompileOptionsError> {
        let replicas = checked_count("num_replicas", self.num_replicas)?;
        let partitions = checked_count("num_partitions", self.num_partitions)?;

        let mut build = Vec::new();
        put_int64(&mut build, 1, self.device_ordinal);
        put_int64(&mut build, 4, replicas);
        put_int64(&mut build, 5, partitions);
        put_bool(&mut build, 6, self.use_spmd_partitioning);
        if let Some(assignment) = &self.device_assignment {
            let encoded = self.encode_assignment(assignment)?;
            put_bytes(&mut build, 9, &encoded);
        }

        let mut out = Vec::with_capacity(build.len() + 8);
        put_bytes(&mut out, 3, &build);
        put_bool(&mut out, 4, self.compile_portable_executable);
        Ok(out)
    }

    fn encode_assignment(&self, rows: &[Vec<i64>]) -> Result<Vec<u8>, CompileOptionsError> {
        if rows.len() != self.num_replicas as usize {
            return Err(CompileOptionsError::AssignmentReplicas {
                expected: self.num_replicas,
                got: rows.len(),
            });
        }
        if let Some((replica, row)) = rows
            .iter()
            .enumerate()
            .find(|(_, row)| row.len() != self.num_partitions as usize)
        {
            return Err(CompileOptionsError::AssignmentPartitions {
                replica,
                expected: self.num_partitions,
                got: row.len(),
            });
        }

        let mut out = Vec::new();
        put_int64(&mut out, 1, i64::from(self.num_replicas));
        put_int64(&mut out, 2, i64::from(self.num_partitions));
        // The proto groups by computation (partition), each listing its device per replica.
        for partition in 0..self.num_partitions as usize {
            let mut ids = Vec::new();
            for row in rows {
                put_varint(&mut ids, row[partition] as u64);
            }
            let mut computation = Vec::new();
            put_bytes(&mut computation, 1, &ids);
            put_bytes(&mut out, 3, &computation);
        }
        Ok(out)
    }
}

fn checked_count(what: &'static str, value: u32) -> Result<i64, CompileOptionsError> {
    if value == 0 {
        return Err(CompileOptionsError::ZeroCount { what });
    }
    if value > i32::MAX as u32 {
        return Err(CompileOptionsError::CountTooLarge { what, value });
    }
    Ok(i64::from(value))
}

const WIRE_VARINT: u32 = 0;
const WIRE_LEN: u32 = 2;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    put_varint(out, u64::from(field << 3 | wire_type));
}

/// An `int64`/`int32` field; negative values take ten bytes, as protobuf sign-extends them.
fn put_int64(out: &mut Vec<u8>, field: u32, value: i64) {
    if value != 0 {
        put_tag(out, field, WIRE_VARINT);
        put_varint(out, value as u64);
    }
}

fn put_bool(out: &mut Vec<u8>, field: u32, value: bool) {
    if value {
        put_tag(out, field, WIRE_VARINT);
        out.push(1);
    }
}

/// A length-delimited field: an embedded message or a packed repeated field.
fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_tag(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0x08 is field 1 as a varint; -1 is ten bytes of all-ones groups.
    const ORDINAL_MINUS_ONE: [u8; 11] = [
        0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ];

    #[test]
    fn varints() {
        let cases: [(u64, &[u8]); 5] = [
            (0, &[0x00]),
            (1, &[0x01]),
            (127, &[0x7f]),
            (300, &[0xac, 0x02]),
            (
                u64::MAX,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ];
        for (value, want) in cases {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out, want, "{value}");
        }
    }

    #[test]
    fn default_options() {
        let bytes = CompileOptions::default().encode().unwrap();
        let mut build = ORDINAL_MINUS_ONE.to_vec();
        build.extend_from_slice(&[0x20, 0x01]); // num_replicas = 1
        build.extend_from_slice(&[0x28, 0x01]); // num_partitions = 1
        let mut want = vec![0x1a, 15]; // field 3, length 15
        want.extend_from_slice(&build);
        assert_eq!(bytes, want);
        assert_eq!(bytes.len(), 17);
    }

    #[test]
    fn spmd_with_device_assignment() {
        let options = CompileOptions {
            num_replicas: 1,
            num_partitions: 2,
            device_ordinal: 0,
            device_assignment: Some(vec![vec![0, 1]]),
            use_spmd_partitioning: true,
            compile_portable_executable: false,
        };
        let want: Vec<u8> = vec![
            0x1a, 22, // executable_build_options, 22 bytes
            0x20, 0x01, // num_replicas = 1
            0x28, 0x02, // num_partitions = 2
            0x30, 0x01, // use_spmd_partitioning = true
            0x4a, 14, // device_assignment, 14 bytes
            0x08, 0x01, // replica_count = 1
            0x10, 0x02, // computation_count = 2
            0x1a, 3, 0x0a, 1, 0x00, // computation 0: replica_device_ids = [0]
            0x1a, 3, 0x0a, 1, 0x01, // computation 1: replica_device_ids = [1]
        ];
        assert_eq!(options.encode().unwrap(), want);
    }

    #[test]
    fn replicas_are_grouped_per_computation() {
        // Two replicas, two partitions: computation p lists [row0[p], row1[p]].
        let options = CompileOptions {
            num_replicas: 2,
            num_partitions: 2,
            device_ordinal: 0,
            device_assignment: Some(vec![vec![0, 1], vec![2, 300]]),
            ..CompileOptions::default()
        };
        let want: Vec<u8> = vec![
            0x1a, 23, // executable_build_options, 23 bytes
            0x20, 0x02, 0x28, 0x02, // num_replicas = 2, num_partitions = 2
            0x4a, 17, // device_assignment, 17 bytes
            0x08, 0x02, 0x10, 0x02, // replica_count = 2, computation_count = 2
            0x1a, 4, 0x0a, 2, 0x00, 0x02, // computation 0: [0, 2]
            0x1a, 5, 0x0a, 3, 0x01, 0xac, 0x02, // computation 1: [1, 300]
        ];
        assert_eq!(options.encode().unwrap(), want);
    }

    #[test]
    fn portable_flag() {
        let options = CompileOptions {
            compile_portable_executable: true,
            ..Default::default()
        };
        let bytes = options.encode().unwrap();
        assert_eq!(&bytes[bytes.len() - 2..], &[0x20, 0x01]);
        assert_eq!(bytes.len(), 19);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let zero = CompileOptions {
            num_partitions: 0,
            ..Default::default()
        };
        assert_eq!(
            zero.encode(),
            Err(CompileOptionsError::ZeroCount {
                what: "num_partitions"
            })
        );

        let rows = CompileOptions {
            num_replicas: 2,
            device_assignment: Some(vec![vec![0]]),
            ..Default::default()
        };
        let err = rows.encode().unwrap_err();
        assert_eq!(
            err,
            CompileOptionsError::AssignmentReplicas {
                expected: 2,
                got: 1
            }
        );
        assert!(
            err.to_string().contains("1 replica rows; expected 2"),
            "{err}"
        );

        let ragged = CompileOptions {
            num_replicas: 2,
            num_partitions: 2,
            device_assignment: Some(vec![vec![0, 1], vec![2]]),
            ..Default::default()
        };
        assert_eq!(
            ragged.encode(),
            Err(CompileOptionsError::AssignmentPartitions {
                replica: 1,
                expected: 2,
                got: 1
            })
        );

        let huge = CompileOptions {
            num_replicas: u32::MAX,
            ..Default::default()
        };
        assert!(matches!(
            huge.encode(),
            Err(CompileOptionsError::CountTooLarge { .. })
        ));
    }
}
