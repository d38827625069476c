/* LD_PRELOAD'ed into the sanitized test run by setup.sh: dlclose does nothing, so a library that
   leaks and is then unloaded (OpenMPI's MCA components, at MPI_Finalize) is still loaded when
   LeakSanitizer reports at exit, and the report names it: lsan.supp can then suppress it by its
   name instead of an "<unknown module>" that no suppression can match. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
