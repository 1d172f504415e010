"""Sub-commands of `fleetcare` that live in their own module (see cli.PLUGIN_COMMANDS)."""
