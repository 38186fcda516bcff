//! Finding TPU chips from the file system alone: no client, no network.
//!
//! TPU chips are PCI devices with Google's vendor id. A chip is usable through VFIO when its
//! IOMMU group has a node under `/dev/vfio`; older drivers expose `/dev/accel*` nodes instead.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// Google's PCI vendor id.
pub const GOOGLE_PCI_VENDOR_ID: u16 = 0x1ae0;

/// TPU generation inferred from PCI ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TpuGeneration {
    /// TPU v2 (device 0x0027, subsystem 0x004e).
    V2,
    /// TPU v3 (device 0x0027, subsystem 0x004f).
    V3,
    /// Device 0x0027 with an unrecognised or unreadable subsystem id.
    V2OrV3,
    /// TPU v4 (device 0x005e).
    V4,
    /// TPU v5e (device 0x0063).
    V5e,
    /// TPU v5p (device 0x0062).
    V5p,
    /// TPU v6e (device 0x006f).
    V6e,
    /// TPU7x (device 0x0076).
    V7x,
    /// A Google device id not known to be a TPU generation.
    Unknown,
}

impl TpuGeneration {
    /// Maps a Google PCI device id (and, for 0x0027, the subsystem id) to a generation.
    pub fn from_pci_ids(device_id: u16, subsystem_device_id: Option<u16>) -> Self {
        match (device_id, subsystem_device_id) {
            (0x0027, Some(0x004e)) => Self::V2,
            (0x0027, Some(0x004f)) => Self::V3,
            (0x0027, _) => Self::V2OrV3,
            (0x005e, _) => Self::V4,
            (0x0063, _) => Self::V5e,
            (0x0062, _) => Self::V5p,
            (0x006f, _) => Self::V6e,
            (0x0076, _) => Self::V7x,
            _ => Self::Unknown,
        }
    }

    /// Short human-readable name, "unknown" when not recognised.
    pub fn name(self) -> &'static str {
        match self {
            Self::V2 => "v2",
            Self::V3 => "v3",
            Self::V2OrV3 => "v2 or v3",
            Self::V4 => "v4",
            Self::V5e => "v5e",
            Self::V5p => "v5p",
            Self::V6e => "v6e",
            Self::V7x => "7x",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for TpuGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One PCI device with Google's vendor id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GooglePciDevice {
    /// PCI address, e.g. `0000:00:05.0`.
    pub address: String,
    /// PCI device id, `None` if unreadable.
    pub device_id: Option<u16>,
    /// PCI subsystem device id, `None` if unreadable.
    pub subsystem_device_id: Option<u16>,
    /// Generation inferred from the ids.
    pub generation: TpuGeneration,
    /// IOMMU group number, `None` when the device has no `iommu_group` link.
    pub iommu_group: Option<String>,
    /// `/dev/vfio/<group>`, when that node exists.
    pub vfio_node: Option<PathBuf>,
}

impl GooglePciDevice {
    /// Whether the chip is usable through VFIO.
    pub fn is_usable(&self) -> bool {
        self.vfio_node.is_some()
    }
}

impl fmt::Display for GooglePciDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", self.address)?;
        match self.device_id {
            Some(id) => write!(f, "device 0x{id:04x}, TPU {}", self.generation)?,
            None => write!(f, "unreadable device id")?,
        }
        write!(f, ")")
    }
}

/// TPU chips found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpuInventory {
    /// Every Google PCI device, usable or not.
    pub google_pci_devices: Vec<GooglePciDevice>,
    /// `/dev/accel*` nodes (also those under a `/dev/accel/` directory).
    pub accel_nodes: Vec<PathBuf>,
}

impl TpuInventory {
    /// Google PCI devices whose VFIO node exists.
    pub fn vfio_chips(&self) -> impl Iterator<Item = &GooglePciDevice> {
        self.google_pci_devices.iter().filter(|d| d.is_usable())
    }

    /// Number of usable chips. VFIO and accel nodes are two drivers for the same chips, so
    /// the larger count is taken rather than the sum.
    pub fn chip_count(&self) -> usize {
        self.vfio_chips().count().max(self.accel_nodes.len())
    }

    /// The generation shared by the usable VFIO chips, if they agree on one.
    pub fn generation(&self) -> Option<TpuGeneration> {
        let mut chips = self.vfio_chips().map(|d| d.generation);
        let first = chips.next()?;
        chips.all(|g| g == first).then_some(first)
    }
}

/// Everything that was examined when no usable TPU was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoTpuFound {
    /// The PCI device directory scanned.
    pub pci_dir: PathBuf,
    /// Whether that directory could be read.
    pub pci_dir_readable: bool,
    /// PCI devices listed there.
    pub pci_devices_scanned: usize,
    /// Devices with Google's vendor id (none usable, or this error would not exist).
    pub google_pci_devices: Vec<GooglePciDevice>,
    /// The VFIO directory checked.
    pub vfio_dir: PathBuf,
    /// Whether it exists.
    pub vfio_dir_exists: bool,
    /// The directory searched for `accel*` nodes (none were there, or this error would not exist).
    pub dev_dir: PathBuf,
}

impl fmt::Display for NoTpuFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no TPU found: ")?;
        if self.pci_dir_readable {
            write!(
                f,
                "scanned {} PCI devices in {}",
                self.pci_devices_scanned,
                self.pci_dir.display()
            )?;
        } else {
            write!(f, "could not read {}", self.pci_dir.display())?;
        }
        if self.google_pci_devices.is_empty() {
            write!(
                f,
                ", none with Google's vendor id 0x{GOOGLE_PCI_VENDOR_ID:04x}"
            )?;
        } else {
            for d in &self.google_pci_devices {
                write!(f, "; Google device {d}")?;
                match &d.iommu_group {
                    Some(g) => write!(
                        f,
                        " is in IOMMU group {g} but {} does not exist",
                        self.vfio_dir.join(g).display()
                    )?,
                    None => write!(f, " has no iommu_group link")?,
                }
            }
        }
        let vfio = if self.vfio_dir_exists {
            "exists"
        } else {
            "does not exist"
        };
        write!(f, "; {} {vfio}", self.vfio_dir.display())?;
        write!(f, "; no accel* nodes in {}", self.dev_dir.display())
    }
}

impl std::error::Error for NoTpuFound {}

/// Looks for TPU chips under `/sys` and `/dev`.
pub fn detect() -> Result<TpuInventory, NoTpuFound> {
    detect_in(Path::new("/sys"), Path::new("/dev"))
}

/// Looks for TPU chips with `sys_root` standing for `/sys` and `dev_root` for `/dev`.
pub fn detect_in(sys_root: &Path, dev_root: &Path) -> Result<TpuInventory, NoTpuFound> {
    let pci_dir = sys_root.join("bus/pci/devices");
    let vfio_dir = dev_root.join("vfio");

    let (pci_dir_readable, mut entries) = match fs::read_dir(&pci_dir) {
        Ok(rd) => (
            true,
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .collect::<Vec<_>>(),
        ),
        Err(_) => (false, Vec::new()),
    };
    entries.sort();

    let google_pci_devices: Vec<GooglePciDevice> = entries
        .iter()
        .filter(|dir| read_hex_u16(&dir.join("vendor")) == Some(GOOGLE_PCI_VENDOR_ID))
        .map(|dir| describe_google_device(dir, &vfio_dir))
        .collect();

    let accel_nodes = accel_nodes(dev_root);
    let inventory = TpuInventory {
        google_pci_devices,
        accel_nodes,
    };
    if inventory.chip_count() > 0 {
        return Ok(inventory);
    }
    Err(NoTpuFound {
        pci_dir,
        pci_dir_readable,
        pci_devices_scanned: entries.len(),
        google_pci_devices: inventory.google_pci_devices,
        vfio_dir_exists: vfio_dir.is_dir(),
        vfio_dir,
        dev_dir: dev_root.to_path_buf(),
    })
}

fn describe_google_device(dir: &Path, vfio_dir: &Path) -> GooglePciDevice {
    let device_id = read_hex_u16(&dir.join("device"));
    let subsystem_device_id = read_hex_u16(&dir.join("subsystem_device"));
    let generation = match device_id {
        Some(id) => TpuGeneration::from_pci_ids(id, subsystem_device_id),
        None => TpuGeneration::Unknown,
    };
    let iommu_group = fs::read_link(dir.join("iommu_group"))
        .ok()
        .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
    let vfio_node = iommu_group
        .as_ref()
        .map(|g| vfio_dir.join(g))
        .filter(|p| p.exists());
    GooglePciDevice {
        address: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        device_id,
        subsystem_device_id,
        generation,
        iommu_group,
        vfio_node,
    }
}

/// `accel*` entries of `dev_root`, plus those of `dev_root/accel/` when that is a directory.
fn accel_nodes(dev_root: &Path) -> Vec<PathBuf> {
    let mut nodes = Vec::new();
    for dir in [dev_root.to_path_buf(), dev_root.join("accel")] {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for entry in rd.filter_map(Result::ok) {
            let path = entry.path();
            let is_accel = entry.file_name().to_string_lossy().starts_with("accel");
            if is_accel && !path.is_dir() {
                nodes.push(path);
            }
        }
    }
    nodes.sort();
    nodes
}

/// Parses a sysfs id file such as "0x1ae0\n".
fn read_hex_u16(path: &Path) -> Option<u16> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u16::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A throwaway root with `sys/` and `dev/`, removed on drop.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "libtpu-sys-detect-{tag}-{}-{n}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("sys/bus/pci/devices")).unwrap();
            fs::create_dir_all(dir.join("dev")).unwrap();
            Self(dir)
        }
        fn sys(&self) -> PathBuf {
            self.0.join("sys")
        }
        fn dev(&self) -> PathBuf {
            self.0.join("dev")
        }
        /// Adds a PCI device; `group` makes an `iommu_group` link to `kernel/iommu_groups/<g>`.
        fn pci(
            &self,
            addr: &str,
            vendor: &str,
            device: &str,
            sub: Option<&str>,
            group: Option<&str>,
        ) {
            let d = self.sys().join("bus/pci/devices").join(addr);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            fs::write(d.join("device"), format!("{device}\n")).unwrap();
            if let Some(s) = sub {
                fs::write(d.join("subsystem_device"), format!("{s}\n")).unwrap();
            }
            if let Some(g) = group {
                let target = self.sys().join("kernel/iommu_groups").join(g);
                fs::create_dir_all(&target).unwrap();
                std::os::unix::fs::symlink(&target, d.join("iommu_group")).unwrap();
            }
        }
        fn vfio(&self, group: &str) {
            fs::create_dir_all(self.dev().join("vfio")).unwrap();
            fs::write(self.dev().join("vfio").join(group), b"").unwrap();
        }
        fn detect(&self) -> Result<TpuInventory, NoTpuFound> {
            detect_in(&self.sys(), &self.dev())
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Asserts that the message of `err` contains every one of `parts`.
    fn assert_mentions(err: &NoTpuFound, parts: &[&str]) {
        let text = err.to_string();
        for part in parts {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
    }

    #[test]
    fn none_found_reports_what_was_scanned() {
        let root = FakeRoot::new("none");
        root.pci("0000:00:01.0", "0x8086", "0x1237", None, Some("1"));
        root.pci("0000:00:02.0", "0x10de", "0x2330", None, Some("2"));
        let err = root.detect().unwrap_err();
        assert_eq!(err.pci_devices_scanned, 2);
        assert!(err.pci_dir_readable);
        assert!(err.google_pci_devices.is_empty());
        assert!(!err.vfio_dir_exists);
        assert_mentions(
            &err,
            &[
                "scanned 2 PCI devices",
                "none with Google's vendor id 0x1ae0",
                "vfio does not exist",
                "no accel* nodes",
            ],
        );
    }

    #[test]
    fn missing_sysfs_is_reported_not_fatal() {
        let root = FakeRoot::new("nosys");
        let err = detect_in(&root.0.join("no-such-sys"), &root.dev()).unwrap_err();
        assert!(!err.pci_dir_readable);
        assert_eq!(err.pci_devices_scanned, 0);
        assert!(err.to_string().contains("could not read"), "{err}");
    }

    #[test]
    fn one_chip_with_vfio_group() {
        let root = FakeRoot::new("vfio");
        root.pci("0000:00:04.0", "0x1ae0", "0x0042", None, None); // a NIC, not bound to VFIO
        root.pci("0000:00:05.0", "0x1ae0", "0x0063", None, Some("7"));
        root.vfio("7");
        let inv = root.detect().unwrap();
        assert_eq!(inv.chip_count(), 1);
        assert_eq!(inv.google_pci_devices.len(), 2);
        let chip = inv.vfio_chips().next().unwrap();
        assert_eq!(chip.address, "0000:00:05.0");
        assert_eq!(chip.device_id, Some(0x0063));
        assert_eq!(chip.generation, TpuGeneration::V5e);
        assert_eq!(chip.iommu_group.as_deref(), Some("7"));
        assert_eq!(chip.vfio_node, Some(root.dev().join("vfio/7")));
        assert_eq!(inv.generation(), Some(TpuGeneration::V5e));
        assert!(inv.accel_nodes.is_empty());
    }

    #[test]
    fn accel_nodes_count_as_chips() {
        let root = FakeRoot::new("accel");
        root.pci("0000:00:04.0", "0x1ae0", "0x0027", Some("0x004f"), None);
        for n in 0..4 {
            fs::write(root.dev().join(format!("accel{n}")), b"").unwrap();
        }
        fs::write(root.dev().join("null"), b"").unwrap();
        let inv = root.detect().unwrap();
        assert_eq!(inv.accel_nodes.len(), 4);
        assert_eq!(inv.chip_count(), 4);
        assert_eq!(inv.google_pci_devices[0].generation, TpuGeneration::V3);
        assert_eq!(inv.generation(), None, "no VFIO chips to agree on");
    }

    #[test]
    fn accel_directory_nodes_are_found() {
        let root = FakeRoot::new("acceldir");
        fs::create_dir_all(root.dev().join("accel")).unwrap();
        fs::write(root.dev().join("accel/accel0"), b"").unwrap();
        let inv = root.detect().unwrap();
        assert_eq!(inv.accel_nodes, vec![root.dev().join("accel/accel0")]);
        assert_eq!(inv.chip_count(), 1);
    }

    #[test]
    fn device_whose_vfio_group_is_missing() {
        let root = FakeRoot::new("nogroup");
        root.pci("0000:00:05.0", "0x1ae0", "0x006f", None, Some("12"));
        fs::create_dir_all(root.dev().join("vfio")).unwrap();
        root.vfio("3"); // another group, not this device's
        let err = root.detect().unwrap_err();
        assert_eq!(err.pci_devices_scanned, 1);
        assert_eq!(err.google_pci_devices.len(), 1);
        let d = &err.google_pci_devices[0];
        assert_eq!(d.generation, TpuGeneration::V6e);
        assert_eq!(d.iommu_group.as_deref(), Some("12"));
        assert_eq!(d.vfio_node, None);
        assert!(err.vfio_dir_exists);
        assert_mentions(
            &err,
            &[
                "0000:00:05.0 (device 0x006f, TPU v6e)",
                "IOMMU group 12 but",
                "vfio/12 does not exist",
            ],
        );
    }

    #[test]
    fn device_without_iommu_group() {
        let root = FakeRoot::new("nolink");
        root.pci("0000:00:05.0", "0x1ae0", "0x0099", None, None);
        let err = root.detect().unwrap_err();
        assert_eq!(err.google_pci_devices[0].generation, TpuGeneration::Unknown);
        assert!(
            err.to_string()
                .contains("TPU unknown) has no iommu_group link"),
            "{err}"
        );
    }

    #[test]
    fn generations_from_pci_ids() {
        use TpuGeneration::*;
        let cases = [
            (0x0027, Some(0x004e), V2),
            (0x0027, Some(0x004f), V3),
            (0x0027, None, V2OrV3),
            (0x005e, None, V4),
            (0x0063, None, V5e),
            (0x0062, None, V5p),
            (0x006f, None, V6e),
            (0x0076, None, V7x),
            (0x0056, None, Unknown),
        ];
        for (id, sub, want) in cases {
            assert_eq!(TpuGeneration::from_pci_ids(id, sub), want, "0x{id:04x}");
        }
        assert_eq!(Unknown.name(), "unknown");
    }

    #[test]
    fn hex_ids_parse_like_sysfs_writes_them() {
        let root = FakeRoot::new("hex");
        let p = root.0.join("id");
        for (text, want) in [
            ("0x1ae0\n", Some(0x1ae0)),
            ("1AE0", Some(0x1ae0)),
            ("zz", None),
        ] {
            fs::write(&p, text).unwrap();
            assert_eq!(read_hex_u16(&p), want, "{text:?}");
        }
        assert_eq!(read_hex_u16(&root.0.join("absent")), None);
    }

    #[test]
    fn this_machine_has_no_tpu() {
        let err = detect().expect_err("no TPU is attached to the build machine");
        assert_eq!(err.pci_dir, Path::new("/sys/bus/pci/devices"));
        assert!(err.google_pci_devices.iter().all(|d| !d.is_usable()));
    }
}
