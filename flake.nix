{
  description = "poot: an LLM inference engine with a Rust core and a Python API";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.05";
    rust-overlay = {
      url = "github:oxalica/rust-overlay";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    flake-utils.url = "github:numtide/flake-utils";
  };

  outputs = { self, nixpkgs, rust-overlay, flake-utils }:
    flake-utils.lib.eachDefaultSystem (system:
      let
        pkgs = import nixpkgs {
          inherit system;
          overlays = [ (import rust-overlay) ];
        };
        # Pinned to the toolchain CI builds with.
        rust = pkgs.rust-bin.stable."1.95.0".default.override {
          extensions = [ "rust-src" "clippy" "rustfmt" ];
        };
        python = pkgs.python311;
      in
      {
        devShells.default = pkgs.mkShell {
          packages = [
            rust
            python
            python.pkgs.pip
            python.pkgs.virtualenv
            pkgs.maturin
            pkgs.gnumake
            pkgs.just
            pkgs.vulkan-loader
            pkgs.vulkan-tools
            pkgs.mesa
            pkgs.pkg-config
          ];
          # wgpu opens the Vulkan loader at run time.
          LD_LIBRARY_PATH = pkgs.lib.makeLibraryPath [ pkgs.vulkan-loader ];
          shellHook = ''
            echo "poot dev shell: run 'make develop' then 'make test'"
          '';
        };
      });
}
