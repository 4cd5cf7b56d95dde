"""One ComponentResource per concern; pure renderers beside the resource wiring."""
