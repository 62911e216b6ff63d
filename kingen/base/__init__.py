"""What every layer uses and none owns: files, the live console line, the allocator.

==========================  ===============================================================
module                      its one job
==========================  ===============================================================
:mod:`.files`               reading a user's text file; writing through a temporary file;
                            which outputs may replace which files
:mod:`.console`             the live progress line of fits and batches
:mod:`.allocator`           the process's memory allocator, set up for a fit
==========================  ===============================================================

(:mod:`kingen.errors`, the one exception a user can cause, sits beside this package.)
"""
