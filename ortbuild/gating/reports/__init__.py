"""Reports: the test table, report.json, report.html, the summary, the build records."""
