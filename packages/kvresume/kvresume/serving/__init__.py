"""`kvresume serve` (kvresume.serving.serve) and the local model folders its tests and benchmark serve
(kvresume.serving.folders): what needs the `serve` extra, apart from the library."""
