# Writes every ```cpp block of a Markdown file to OUT/NAME.cpp, NAME taken from the block's first
# line, "// README example: NAME", and prints the names. A block without that line is an error:
# every C++ block of the README is a program the tests compile.
/^```cpp[ \t]*$/ { inside = 1; name = ""; first = 1; next }
/^```[ \t]*$/ && inside {
  inside = 0
  close(file)
  print name
  next
}
inside {
  if (first) {
    first = 0
    if (match($0, /^\/\/ README example: [a-z0-9-]+$/)) {
      name = substr($0, 20)
      file = out "/" name ".cpp"
    } else {
      print "README line " NR ": a C++ block must start with \"// README example: NAME\"" > "/dev/stderr"
      exit 1
    }
  }
  print > file
}
