# qmpprof — the two commands a newcomer needs are `make demo` and `make test`.
# Each installs what is missing first: Debian packages (QEMU, GDB, a C toolchain),
# a virtualenv in .venv with qmpprof and its test tools.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
#: What `make demo` needs (QEMU, a C toolchain: gcc -static for the Linux guest's programs,
#: a venv), the commands that tell they are there; the tests need the rest as well.
DEMO_APT_PACKAGES := qemu-system-x86 gcc libc6-dev make binutils python3-venv $(if $(filter aarch64,$(ARCH)),qemu-system-arm gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
DEMO_TOOLS := qemu-system-x86_64 gcc make ld readelf $(if $(filter aarch64,$(ARCH)),qemu-system-aarch64 aarch64-linux-gnu-gcc)
APT_PACKAGES := $(DEMO_APT_PACKAGES) gdb tmux dwarves debuginfod libarchive-tools linux-perf libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-clients-qemu libvirt-daemon-system libvirt-daemon-system-sysv python3-libvirt memtest86+ qemu-system-arm gdb-multiarch gcc-aarch64-linux-gnu libc6-dev-arm64-cross u-boot-qemu debootstrap
#: A path stands for a package that installs no command (memtest86+ and u-boot-qemu: real
#: bare-metal programs with no symbols for the tests, x86 and AArch64; libvirt-daemon-system-sysv: a system-mode libvirtd,
#: its libvirt-qemu user, without systemd as init; python3-libvirt: what --libvirt uses;
#: debootstrap is in /usr/sbin, on no PATH but root's).
TOOLS := $(DEMO_TOOLS) gdb tmux pahole debuginfod bsdtar perf libvirtd virtlogd virsh virt-qemu-qmp-proxy /etc/init.d/libvirtd /usr/lib/python3/dist-packages/libvirt.py /boot/memtest86+x64.bin qemu-system-aarch64 gdb-multiarch aarch64-linux-gnu-gcc /usr/lib/u-boot/qemu_arm64/u-boot.bin /usr/sbin/debootstrap
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help demo test unit integration fuzz mutants bench kaslr-bench serve-soak lint format deps demo-deps system-deps demo-system-deps guest guest-aarch64 linux-guest linux-guest-aarch64 stock-guest linux-oracle linux-arm64-oracle i386-oracle aarch64-oracle consumers clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

demo: demo-deps $(if $(filter linux,$(GUEST)),,$(if $(filter aarch64,$(ARCH)),guest-aarch64,guest))  ## boot the example guest (ARCH=i386: its 32-bit build, ARCH=aarch64 its AArch64 one; GUEST=linux: Debian's kernel, ~75 MB fetched once; GUEST=linux ARCH=aarch64: Debian's arm64 kernel, ~300 MB), profile it 10 s, write demo/, print the hottest stacks
	@PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/demo.sh

test: deps guest guest-aarch64 linux-guest linux-guest-aarch64 stock-guest consumers  ## run every test (unit, consumers, integration against a real QEMU)
	$(BIN)/pytest -q tests

unit: deps  ## unit tests only (no QEMU), without the slow sweeps (`make test` runs those)
	$(BIN)/pytest -q -m 'not slow' tests/unit

integration: deps guest guest-aarch64 linux-guest linux-guest-aarch64 stock-guest  ## integration tests only (boots the example guest)
	$(BIN)/pytest -q tests/integration

mutants: deps guest guest-aarch64 linux-guest linux-guest-aarch64  ## break qmpprof in one place at a time (a frame kind dropped, the KASLR slide off by one, ...) and say which test catches each
	$(BIN)/python -m tests.mutants.run

#: Cases per fuzz test under `make fuzz` (tests that parse a whole file per case run a
#: tenth of it: tests/fuzz/file_budget.py); the default gives well over 100,000 in all.
FUZZ_CASES ?= 10000
fuzz: deps guest guest-aarch64  ## every fuzz test (tests/fuzz) with FUZZ_CASES cases each; prints cases/s and failures
	QMPPROF_FUZZ_CASES=$(FUZZ_CASES) $(BIN)/pytest -q tests/fuzz

ACCEL ?= tcg
BENCH_STAMP := $(VENV)/.bench-installed
bench: deps guest linux-guest $(BENCH_STAMP)  ## benchmarks, TCG by default (ACCEL=kvm where KVM works); each ends with JSON
	$(BIN)/python bench/unwind.py
	$(BIN)/python bench/sample_cost.py --accel $(ACCEL)
	for abi in $$(bash examples/linux/fetch.sh --list); do $(BIN)/python bench/linux_sample_cost.py --abi $$abi || exit 1; done
	$(BIN)/python bench/linux_sample_cost.py --smp 4 --workloads crunch
	$(BIN)/python bench/linux_rates.py
	$(BIN)/python bench/linux_perturbation.py
	$(BIN)/python bench/perturbation.py --accel $(ACCEL)
	$(BIN)/python bench/max_rate.py --accel $(ACCEL)
	$(BIN)/python bench/smp.py --accel $(ACCEL)
	$(BIN)/python bench/linux_vcpus.py
	$(BIN)/python bench/startup.py

#: Boots per kernel for `make kaslr-bench` (the issue's acceptance: 20 of 20).
KASLR_BOOTS ?= 20
kaslr-bench: deps linux-guest  ## boot the Linux guest KASLR_BOOTS times per kernel: does qmpprof find the guest's own KASLR slide each time (20-40 s a boot)
	$(BIN)/python bench/kaslr_boots.py --boots $(KASLR_BOOTS)

#: `make serve-soak`: scrapes of `qmpprof serve` and the minutes they are spread over
#: (issue 26's acceptance: 200 over 20, RSS growth under 10 %).
SOAK_SCRAPES ?= 200
SOAK_MINUTES ?= 20
serve-soak: deps guest  ## scrape `qmpprof serve` on two example guests SOAK_SCRAPES times over SOAK_MINUTES minutes; prints its RSS at start and end and the growth
	$(BIN)/python bench/serve_soak.py --scrapes $(SOAK_SCRAPES) --minutes $(SOAK_MINUTES)

# The optional `bench` dependencies (qemu.qmp, compared with qmpprof's own QMP client).
$(BENCH_STAMP): $(STAMP)
	PYTHONWARNINGS=ignore $(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

lint: deps  ## ruff (lint + format check), mypy --strict (code, tests, benchmarks) and the layering rules
	$(BIN)/ruff check qmpprof tests $(wildcard bench) docs/images
	$(BIN)/ruff format --check qmpprof tests $(wildcard bench) docs/images
	$(BIN)/mypy qmpprof tests $(wildcard bench) docs/images
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_layers.py

format: deps  ## reformat the code with ruff
	$(BIN)/ruff format qmpprof tests $(wildcard bench) docs/images
	$(BIN)/ruff check --fix qmpprof tests $(wildcard bench) docs/images

# Bytecode for qmpprof's own modules, as `pip install` writes it for an installed
# package: an editable install has none, and where PYTHONDONTWRITEBYTECODE is set Python
# never writes it, so every `qmpprof` process compiled the whole package again (0.25 s of
# a 0.6 s `dump`). compileall rewrites only what changed. demo-deps is the same with the
# demo's Debian packages only (deps, for the tests, installs all of them).
deps: system-deps $(STAMP)
	@$(BIN)/python -m compileall -q qmpprof
demo-deps: demo-system-deps $(STAMP)
	@$(BIN)/python -m compileall -q qmpprof

# apt_install TOOLS,PACKAGES: install PACKAGES from Debian's archive unless each of TOOLS
# is on PATH (or, given as a path, exists) and Python has venv.
define apt_install
	@missing=""; \
	for tool in $(1); do \
	  case $$tool in /*) [ -e $$tool ] ;; *) command -v $$tool ;; esac >/dev/null 2>&1 || \
	    missing="$$missing $$tool"; \
	done; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(2) >/dev/null; \
	fi
endef

system-deps:  ## install QEMU, GDB, a C toolchain and a debuginfod server (tests) from Debian's packages if missing
	$(call apt_install,$(TOOLS),$(APT_PACKAGES))

demo-system-deps:  ## install what `make demo` needs only (QEMU, gcc, make, binutils, python3-venv) if missing
	$(call apt_install,$(DEMO_TOOLS),$(DEMO_APT_PACKAGES))

# PYTHONWARNINGS: setuptools warns at length that an install is editable (on a new
# user's first screen of `make demo`); pip and its build run quiet.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	PYTHONWARNINGS=ignore $(BIN)/pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(BIN)/pip install -q -e '.[dev]'
	touch $@

consumers:  ## install the tools that open our outputs in tests (go tool pprof, chromium, speedscope)
	bash tests/consumers/install.sh

guest:  ## build the example guest OS, both variants, 64- and 32-bit x86 (the tests unwind all four)
	$(MAKE) -s -C examples/guest ARCH=x86_64
	$(MAKE) -s -C examples/guest ARCH=x86_64 VARIANT=nofp
	$(MAKE) -s -C examples/guest ARCH=i386
	$(MAKE) -s -C examples/guest ARCH=i386 VARIANT=nofp

guest-aarch64:  ## build the example guest's AArch64 build, both variants (Debian's cross gcc)
	$(MAKE) -s -C examples/guest ARCH=aarch64
	$(MAKE) -s -C examples/guest ARCH=aarch64 VARIANT=nofp

linux-guest:  ## fetch Debian's kernels (6.1, 6.12, bullseye's 5.10, 6.1's 686-pae) + debug vmlinux and each release's libc6 (+ -dbg) once (~/.cache/qmpprof), build the initramfs files and sysroots
	bash examples/linux/fetch.sh --all >/dev/null
	$(MAKE) -s -C examples/linux
	bash examples/linux/i386/fetch.sh >/dev/null
	$(MAKE) -s -C examples/linux/i386

stock-guest: system-deps  ## build Debian 12's own user space once (debootstrap --variant=minbase bookworm, python3, perl: a 160 MB initramfs in ~/.cache/qmpprof/stock, ~1 min) for Debian's 6.1 kernel: stock programs, stripped, for tests/integration/test_linux_stock.py
	bash examples/linux/fetch.sh >/dev/null
	bash examples/linux/stock/build.sh >/dev/null

#: The arm64 kernel `make test` boots (`make linux-arm64-oracle` fetches the others).
ARM64_TEST_ABI := 6.1.0-50-cloud-arm64

linux-guest-aarch64:  ## fetch Debian's arm64 6.1 cloud kernel + debug vmlinux and arm64 libc6 (+ -dbg) once (~/.cache/qmpprof, ~300 MB), build the AArch64 Linux guest's initramfs and sysroot
	bash examples/linux/aarch64/fetch.sh $(ARM64_TEST_ABI) >/dev/null
	$(MAKE) -s -C examples/linux/aarch64

#: Pauses per arm64 kernel and configuration under `make linux-arm64-oracle`.
ARM64_ORACLE_PAUSES ?= 100

linux-arm64-oracle: deps linux-guest-aarch64  ## qmpprof with no files vs GDB on every Debian arm64 kernel (6.1 generic and cloud, 6.12; ~2.3 GB fetched once), ARM64_ORACLE_PAUSES pauses per configuration
	bash examples/linux/aarch64/fetch.sh --all >/dev/null
	failed=0; for abi in $$(bash examples/linux/aarch64/fetch.sh --list); do \
		QMPPROF_ARM64_LINUX_ABI=$$abi QMPPROF_ARM64_LINUX_PAUSES=$(ARM64_ORACLE_PAUSES) \
		$(BIN)/pytest -q -s tests/integration/test_linux_arm64.py || failed=1; done; exit $$failed

#: Pauses per kernel and KASLR setting under `make linux-oracle` (each ~10 s).
ORACLE_PAUSES ?= 100
#: QEMU's CPU model for `make linux-oracle` (empty: qemu64; `max`: 5-level paging).
ORACLE_CPU ?=

linux-oracle: deps linux-guest  ## qmpprof vs GDB on the Linux guest: every kernel (fetch.sh --list), KASLR off and on, ORACLE_PAUSES pauses each (ORACLE_CPU=max: 5-level paging)
	failed=0; for abi in $$(bash examples/linux/fetch.sh --list); do for kaslr in 0 1; do \
		QMPPROF_LINUX_GDB_ABI=$$abi QMPPROF_LINUX_GDB_KASLR=$$kaslr QMPPROF_LINUX_GDB_SWEEP=$(ORACLE_PAUSES) \
		QMPPROF_LINUX_GDB_CPU=$(ORACLE_CPU) \
		$(BIN)/pytest -q -s tests/integration/test_linux_gdb_agreement.py || failed=1; done; done; exit $$failed

#: Pauses per configuration under `make i386-oracle` (each about a second).
I386_PAUSES ?= 150

i386-oracle: deps guest  ## qmpprof vs GDB on the 32-bit example guest: 2-level and PAE paging, frame pointers and CFI, kernel and user workloads, I386_PAUSES pauses each
	QMPPROF_I386_PAUSES=$(I386_PAUSES) $(BIN)/pytest -q -s tests/integration/test_gdb_agreement_i386.py tests/integration/test_linux_i386.py

#: Pauses per configuration for `make aarch64-oracle` (the issue's acceptance: 150 or more).
AARCH64_PAUSES ?= 150
aarch64-oracle: deps guest-aarch64  ## qmpprof vs gdb-multiarch on the AArch64 example guest: frame records and CFI, signed and unsigned return addresses, AARCH64_PAUSES pauses each
	QMPPROF_AARCH64_PAUSES=$(AARCH64_PAUSES) $(BIN)/pytest -q -s tests/integration/test_gdb_agreement_aarch64.py

.PHONY: pictures
pictures: deps linux-guest consumers  ## regenerate docs/images/ (flame graph, summary, top) from a real run of the Linux demo guest
	$(BIN)/python docs/images/make_pictures.py

clean:  ## remove the venv, demo output and guest builds
	rm -rf $(VENV) demo examples/guest/build examples/linux/build
