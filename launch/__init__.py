"""One experiment launcher driven by a plan file (issue 45): base report -> rule -> runs -> report."""
