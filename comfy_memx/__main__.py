from ._launcher import main

main()
