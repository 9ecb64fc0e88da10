"""What a run leaves for people: SUMMARY.md (summary, claims_md, sources), the HTML pages, share.zip, the paste-safe
Markdown and machine-path scrubbing, and the readers of run.json/results. Called by run/ after every run and by matrix/ and bisect/."""
